package main

import (
	"context"
	"encoding/base64"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"path"
	"path/filepath"
	"strings"

	"github.com/lizard-build/lizard/internal/apiclient"
)

// maxUpload keeps an upload's JSON body (base64: 4/3 of the file) under
// the API's 64 MiB limit for file writes.
const maxUpload = 46 << 20

// remotePath is ID:/path in the sandbox.
type remotePath struct{ id, path string }

// parseCopyArg says whether arg names a path in a sandbox: ID:/path, with
// no slash before the colon (so ./a:b is local).
func parseCopyArg(arg string) (remotePath, bool, error) {
	id, p, ok := strings.Cut(arg, ":")
	if !ok || id == "" || strings.Contains(id, "/") {
		return remotePath{}, false, nil
	}
	if !strings.HasPrefix(p, "/") {
		return remotePath{}, false, fmt.Errorf("%q: the path in the sandbox must be absolute (ID:/path)", arg)
	}
	return remotePath{id: id, path: p}, true, nil
}

func sandboxCopy(ctx context.Context, c *apiclient.Client, args []string) error {
	fs, _ := sandboxFlags("cp")
	pos, err := parse(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 2 {
		return fmt.Errorf("cp needs SRC and DST\n%s", sandboxUsage)
	}
	src, srcRemote, err := parseCopyArg(pos[0])
	if err != nil {
		return err
	}
	dst, dstRemote, err := parseCopyArg(pos[1])
	if err != nil {
		return err
	}
	switch {
	case srcRemote == dstRemote:
		return fmt.Errorf("cp copies between this machine and a sandbox: exactly one of SRC and DST must be ID:/path")
	case dstRemote:
		return upload(ctx, c, pos[0], dst)
	default:
		return download(ctx, c, src, pos[1])
	}
}

func upload(ctx context.Context, c *apiclient.Client, local string, dst remotePath) error {
	var data []byte
	var err error
	if local == "-" {
		data, err = io.ReadAll(io.LimitReader(os.Stdin, maxUpload+1))
	} else {
		data, err = readSmallFile(local)
		if strings.HasSuffix(dst.path, "/") {
			dst.path += filepath.Base(local)
		}
	}
	if err != nil {
		return err
	}
	if len(data) > maxUpload {
		return fmt.Errorf("%s: larger than %d MiB, the most one upload carries", local, maxUpload>>20)
	}
	req := map[string]string{
		"path":     dst.path,
		"content":  base64.StdEncoding.EncodeToString(data),
		"encoding": "base64",
	}
	_, err = c.Call(ctx, http.MethodPost, apiclient.SandboxPath(dst.id, "/files"), req)
	return err
}

func readSmallFile(name string) ([]byte, error) {
	f, err := os.Open(name)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if !fi.Mode().IsRegular() {
		return nil, fmt.Errorf("%s: not a regular file (cp copies one file)", name)
	}
	if fi.Size() > maxUpload {
		return nil, fmt.Errorf("%s: larger than %d MiB, the most one upload carries", name, maxUpload>>20)
	}
	return io.ReadAll(f)
}

func download(ctx context.Context, c *apiclient.Client, src remotePath, local string) error {
	resp, err := c.Request(ctx, http.MethodGet, apiclient.SandboxPath(src.id, "/files?path="+url.QueryEscape(src.path)), nil, nil)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if local == "-" {
		_, err := io.Copy(os.Stdout, resp.Body)
		return err
	}
	if fi, err := os.Stat(local); err == nil && fi.IsDir() {
		local = filepath.Join(local, path.Base(src.path))
	}
	// A partial download must not replace a good file: write beside it,
	// then rename.
	tmp, err := os.CreateTemp(filepath.Dir(local), "."+filepath.Base(local)+".lizard-*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if _, err := io.Copy(tmp, resp.Body); err != nil {
		tmp.Close()
		return fmt.Errorf("downloading %s:%s: %w", src.id, src.path, err)
	}
	if err := tmp.Chmod(0o644); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), local)
}
