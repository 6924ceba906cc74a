package server

import (
	"errors"
	"net/http"
	"os"
	"strings"
	"syscall"
	"unicode/utf8"

	"golang.org/x/sys/unix"
)

// User-defined file metadata (envd 0.6.2): an upload's X-Metadata-<key>
// headers become extended attributes user.e2b.<key> of the file, and every
// entry envd describes carries them back. They live on the file itself, so
// a rename keeps them and setfattr in the sandbox sets them too; the user.
// namespace is the one unprivileged users may write.
const (
	metadataHeaderPrefix = "X-Metadata-"
	metadataXattrPrefix  = "user.e2b."
	// maxMetadataKey keeps an attribute name within the kernel's
	// XATTR_NAME_MAX (255 bytes).
	maxMetadataKey = 255 - len(metadataXattrPrefix)
	// maxMetadataTotal bounds the names and values of one file's metadata
	// together: ext4 keeps all of an inode's attributes in one 4 KiB block.
	maxMetadataTotal = 4096
	// maxXattrList bounds the attribute name list read from a file.
	maxXattrList = 64 << 10
)

// metadataFromHeader reads an upload's metadata from its X-Metadata-*
// headers; keys are lower case (HTTP header names are not case
// sensitive). nil when there is none.
func metadataFromHeader(h http.Header) (map[string]string, error) {
	var md map[string]string
	for name, values := range h {
		key, ok := cutPrefixFold(name, metadataHeaderPrefix)
		if !ok || len(values) == 0 {
			continue
		}
		if len(values) > 1 {
			return nil, errInvalid("metadata key %q is given %d times; give each key once", strings.ToLower(key), len(values))
		}
		if md == nil {
			md = make(map[string]string)
		}
		md[strings.ToLower(key)] = values[0]
	}
	return md, validateMetadata(md)
}

func cutPrefixFold(s, prefix string) (string, bool) {
	if len(s) < len(prefix) || !strings.EqualFold(s[:len(prefix)], prefix) {
		return "", false
	}
	return s[len(prefix):], true
}

// validateMetadata checks what writeMetadata would store: keys of 1 to
// maxMetadataKey bytes, keys and values printable US-ASCII, all of it at
// most maxMetadataTotal bytes.
func validateMetadata(md map[string]string) error {
	total := 0
	for k, v := range md {
		switch {
		case k == "":
			return errInvalid("a metadata key is empty (header %s with nothing after the prefix)", metadataHeaderPrefix)
		case len(k) > maxMetadataKey:
			return errInvalid("metadata key %.32q… is %d bytes, more than %d", k, len(k), maxMetadataKey)
		case !printableASCII(k):
			return errInvalid("metadata key %q has a character outside printable US-ASCII", k)
		case !printableASCII(v):
			return errInvalid("the value of metadata key %q has a character outside printable US-ASCII (0x20-0x7e)", k)
		}
		total += len(metadataXattrPrefix) + len(k) + len(v)
	}
	if total > maxMetadataTotal {
		return errInvalid("metadata of %d bytes (names with their %s prefix, and values) is more than %d", total, metadataXattrPrefix, maxMetadataTotal)
	}
	return nil
}

func printableASCII(s string) bool {
	for i := range len(s) {
		if s[i] < 0x20 || s[i] > 0x7e {
			return false
		}
	}
	return true
}

// writeMetadata gives the open file f the attributes of md. A file system
// without extended attributes keeps none, silently: the entry read back
// afterwards says what was kept.
func writeMetadata(f *os.File, md map[string]string) error {
	for k, v := range md {
		err := unix.Fsetxattr(int(f.Fd()), metadataXattrPrefix+k, []byte(v), 0)
		if xattrUnsupported(err) {
			return nil
		}
		if err != nil {
			return &os.PathError{Op: "setxattr", Path: f.Name(), Err: err}
		}
	}
	return nil
}

// readMetadata returns the metadata of p, nil when it has none; a symlink
// has its target's (the kernel keeps no user. attributes on links, and
// uploads write through them), as in E2B's envd. Reading is best-effort,
// as in E2B's envd: a file whose attributes cannot be read has none, and
// values that are not UTF-8 (set in the sandbox) are left out, since a
// protobuf string must be.
func readMetadata(p string) map[string]string {
	names, err := listXattrs(p)
	if err != nil {
		return nil
	}
	var md map[string]string
	for _, name := range names {
		key, ok := strings.CutPrefix(name, metadataXattrPrefix)
		if !ok || key == "" {
			continue
		}
		v, err := getXattr(p, name)
		if err != nil || !utf8.ValidString(key) || !utf8.Valid(v) {
			continue
		}
		if md == nil {
			md = make(map[string]string)
		}
		md[key] = string(v)
	}
	return md
}

func listXattrs(p string) ([]string, error) {
	size, err := unix.Listxattr(p, nil)
	if err != nil || size == 0 {
		return nil, err
	}
	if size > maxXattrList {
		size = maxXattrList
	}
	buf := make([]byte, size)
	n, err := unix.Listxattr(p, buf)
	if err != nil {
		return nil, err
	}
	var names []string
	for _, name := range strings.Split(string(buf[:n]), "\x00") {
		if name != "" {
			names = append(names, name)
		}
	}
	return names, nil
}

func getXattr(p, name string) ([]byte, error) {
	size, err := unix.Getxattr(p, name, nil)
	if err != nil || size == 0 {
		return nil, err
	}
	buf := make([]byte, size)
	n, err := unix.Getxattr(p, name, buf)
	if err != nil {
		return nil, err
	}
	return buf[:n], nil
}

func xattrUnsupported(err error) bool {
	return errors.Is(err, syscall.ENOTSUP) || errors.Is(err, syscall.EOPNOTSUPP)
}
