package template

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"
)

// seedsDir holds debootstrapped trees that later builds start from
// (Registry.SeedMaxAge): <dir>/.seeds/<key> holds rootfs/ and the stamp
// file, whose time is when debootstrap made it; <key>.lock is held while a
// build reads or makes that seed.
const seedsDir = ".seeds"

const seedStamp = "made"

// seedKey names the seed of rec from mirror: the same suite, variant,
// packages and mirror debootstrap the same tree.
func seedKey(rec recipe, mirror string) string {
	h := sha256.New()
	fmt.Fprintf(h, "%s\x00%s\x00%s\x00%s", rec.Suite, rec.Variant, strings.Join(rec.Packages, ","), mirror)
	return rec.Suite + "-" + hex.EncodeToString(h.Sum(nil))[:16]
}

// debootstrap makes the empty directory rootfs rec's debootstrapped tree:
// with SeedMaxAge set, a copy of the seed of rec when one younger than that
// is there, else debootstrap's own, which is then kept as the seed (a
// failure to keep it is only a warning). Builds of different templates at
// once wait for each other here, so debootstrap runs once.
func (r *Registry) debootstrap(ctx context.Context, deb string, rec recipe, rootfs, mirror string, lockFile *os.File, rep *reporter, secondStage func(context.Context) error) error {
	if r.SeedMaxAge <= 0 {
		return runDebootstrap(ctx, r.RunCommand, deb, rec, rootfs, mirror, lockFile, rep, secondStage)
	}
	dir := filepath.Join(r.dir, seedsDir)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("seeds directory: %w", err)
	}
	key := seedKey(rec, mirror)
	l, err := flock(ctx, filepath.Join(dir, key+".lock"), syscall.LOCK_EX, func() {
		rep.printf("waiting for another build's debootstrap of %s", rec.Suite)
	})
	if err != nil {
		return err
	}
	defer func() {
		syscall.Flock(int(l.Fd()), syscall.LOCK_UN)
		l.Close()
	}()
	r.dropOldSeeds(dir, rep)

	seed := filepath.Join(dir, key)
	if st, err := os.Stat(filepath.Join(seed, seedStamp)); err == nil && time.Since(st.ModTime()) < r.SeedMaxAge {
		rep.printf("starting from the debootstrap of %s made %s ago (%s)", rec.Suite, time.Since(st.ModTime()).Round(time.Second), seed)
		if err := copyTree(ctx, r.RunCommand, filepath.Join(seed, rootfsDir), rootfs); err != nil {
			return fmt.Errorf("copy the debootstrapped tree: %w", err)
		}
		return nil
	}
	if err := runDebootstrap(ctx, r.RunCommand, deb, rec, rootfs, mirror, lockFile, rep, secondStage); err != nil {
		return err
	}
	if err := r.keepSeed(ctx, dir, key, rootfs); err != nil {
		rep.printf("warning: could not keep the debootstrapped tree for the next build: %v", err)
	}
	return nil
}

// keepSeed makes a copy of rootfs the seed key, replacing the one there.
func (r *Registry) keepSeed(ctx context.Context, dir, key, rootfs string) error {
	tmp, err := os.MkdirTemp(dir, key+".tmp-")
	if err != nil {
		return err
	}
	done := false
	defer func() {
		if !done {
			r.removeTree(tmp)
		}
	}()
	if err := os.Mkdir(filepath.Join(tmp, rootfsDir), 0o755); err != nil {
		return err
	}
	if err := copyTree(ctx, r.RunCommand, rootfs, filepath.Join(tmp, rootfsDir)); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(tmp, seedStamp), nil, 0o644); err != nil {
		return err
	}
	seed := filepath.Join(dir, key)
	if err := r.removeTree(seed); err != nil {
		return err
	}
	if err := os.Rename(tmp, seed); err != nil {
		return err
	}
	done = true
	return nil
}

// dropOldSeeds removes the seeds (and unfinished copies) older than
// SeedMaxAge: nothing would start from them.
func (r *Registry) dropOldSeeds(dir string, rep *reporter) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return
	}
	for _, e := range ents {
		if !e.IsDir() {
			continue
		}
		p := filepath.Join(dir, e.Name())
		when := filepath.Join(p, seedStamp)
		if strings.Contains(e.Name(), ".tmp-") {
			when = p
		}
		if st, err := os.Stat(when); err == nil && time.Since(st.ModTime()) < r.SeedMaxAge {
			continue
		}
		if err := r.removeTree(p); err != nil {
			rep.printf("warning: could not remove the old seed %s: %v", p, err)
		}
	}
}

// copyTree copies the contents of the directory src into the existing
// directory dst, keeping owners, modes, links, devices and times (cp -a;
// reflinks where the filesystem has them), with run (nil: cmd.Run).
func copyTree(ctx context.Context, run RunFunc, src, dst string) error {
	cmd := exec.CommandContext(ctx, "cp", "-a", "--reflink=auto", src+"/.", dst)
	if out, err := combinedOutput(run, cmd); err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		return fmt.Errorf("%v: %s", err, strings.TrimSpace(string(out)))
	}
	return nil
}
