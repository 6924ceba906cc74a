package template

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
)

// manifestFile is a version's manifest: every entry of its rootfs with its
// type, mode, owner, size and SHA-256 (manifestLine), from which another
// node can check a copy (VerifyVersion).
const manifestFile = "manifest"

// Version is one stored version of a template, as another node can name
// it.
type Version struct {
	Name string // the template's name
	// Digest is "sha256:<hex>" of the version's manifest and config
	// (digestOf): the same rootfs and config have the same digest on every
	// node. "" for versions made before digests.
	Digest string
	Dir    string // the version's directory, absolute
}

// digestConfig is what of a template's metadata its digest covers: what
// its sandboxes see besides the rootfs. The name, the version label and
// the build time are not: two builds of the same bits are one version.
type digestConfig struct {
	Env          []string `json:"env"`
	Workdir      string   `json:"workdir"`
	User         string   `json:"user"`
	StartCommand []string `json:"startCommand"`
	Entrypoint   []string `json:"entrypoint"`
	Cmd          []string `json:"cmd"`
	ReadyCommand []string `json:"readyCommand"`
}

// digestOf is the digest of a version whose rootfs has manifest man and
// whose metadata is m: the SHA-256 of a header, the manifest's own SHA-256
// and the config (digestConfig) as JSON.
func digestOf(man []byte, m metadata) string {
	cfg, _ := json.Marshal(digestConfig{
		Env: m.Env, Workdir: m.Workdir, User: m.User, StartCommand: m.StartCommand,
		Entrypoint: m.Entrypoint, Cmd: m.Cmd, ReadyCommand: m.ReadyCommand,
	})
	ms := sha256.Sum256(man)
	h := sha256.New()
	fmt.Fprintf(h, "lizard-template v1\nmanifest sha256:%s\nconfig %s\n", hex.EncodeToString(ms[:]), cfg)
	return "sha256:" + hex.EncodeToString(h.Sum(nil))
}

// dirDigest is how digest appears in a version directory's name
// (<name>@sha256-<hex>): no ':' in paths that go into mount options.
func dirDigest(digest string) string { return strings.Replace(digest, ":", "-", 1) }

// validDigest reports whether s is "sha256:" and 64 lowercase hex digits.
func validDigest(s string) bool {
	h, ok := strings.CutPrefix(s, "sha256:")
	if !ok || len(h) != 64 {
		return false
	}
	_, err := hex.DecodeString(h)
	return err == nil && strings.ToLower(h) == h
}

// readVersion reads the version in directory dir (<dir>/.v/<name>@…).
func readVersion(dir string) (Version, error) {
	name, _, ok := strings.Cut(filepath.Base(dir), "@")
	if !ok || !validName(name) {
		return Version{}, notFound(filepath.Base(dir), "not a version directory")
	}
	m, err := readMetadata(name, dir)
	if err != nil {
		return Version{}, err
	}
	abs, err := filepath.Abs(dir)
	if err != nil {
		return Version{}, err
	}
	return Version{Name: name, Digest: m.Digest, Dir: abs}, nil
}

// Versions lists every complete version the registry holds (current or
// not, of r's own templates: a project's registry lists the project's),
// sorted by directory.
func (r *Registry) Versions() ([]Version, error) {
	ents, err := os.ReadDir(filepath.Join(r.dir, versionsDir))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("list template versions: %w", err)
	}
	var out []Version
	for _, e := range ents {
		if !e.IsDir() {
			continue
		}
		v, err := readVersion(filepath.Join(r.dir, versionsDir, e.Name()))
		if err != nil {
			continue // not a version, or not a complete one
		}
		out = append(out, v)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Dir < out[j].Dir })
	return out, nil
}

// ByDigest returns the version of template name with digest (see
// Version.Digest), errdefs.ErrNotFound when r holds none.
func (r *Registry) ByDigest(name, digest string) (Version, error) {
	if !validName(name) || !validDigest(digest) {
		return Version{}, notFound(name+"@"+digest, "")
	}
	v, err := readVersion(filepath.Join(r.dir, versionsDir, name+"@"+dirDigest(digest)))
	if err != nil {
		return Version{}, err
	}
	if v.Digest != digest {
		return Version{}, notFound(name+"@"+digest, "its metadata names another digest")
	}
	return v, nil
}
