package s3_test

import (
	"context"
	"errors"
	"os"
	"testing"

	"github.com/lizard-build/lizard/internal/errdefs"
	"github.com/lizard-build/lizard/internal/objstore/objtest"
	"github.com/lizard-build/lizard/internal/objstore/s3"
	"github.com/lizard-build/lizard/internal/objstore/vgwtest"
)

func TestParseURL(t *testing.T) {
	for _, c := range []struct {
		url  string
		want s3.Config
		bad  bool
	}{
		{url: "s3://b?endpoint=127.0.0.1:9000&region=r&insecure=true", want: s3.Config{Bucket: "b", Endpoint: "127.0.0.1:9000", Region: "r", Insecure: true}},
		{url: "s3://b/p/q?endpoint=http://h:1/", want: s3.Config{Bucket: "b", Prefix: "p/q/", Endpoint: "h:1", Insecure: true}},
		{url: "s3://b?endpoint=https://h&credentials-file=/f&profile=x&path-style=1", want: s3.Config{Bucket: "b", Endpoint: "h", CredentialsFile: "/f", Profile: "x", PathStyle: true}},
		{url: "s3://b", want: s3.Config{Bucket: "b"}},
		{url: "http://b", bad: true},
		{url: "s3:///x", bad: true},
		{url: "s3://b?endpont=h", bad: true},
		{url: "s3://b?insecure=maybe", bad: true},
	} {
		got, err := s3.ParseURL(c.url)
		if c.bad {
			if !errors.Is(err, errdefs.ErrInvalid) {
				t.Errorf("%s: %v, want ErrInvalid", c.url, err)
			}
			continue
		}
		if err != nil || got != c.want {
			t.Errorf("%s = %+v, %v; want %+v", c.url, got, err, c.want)
		}
	}
}

func TestConformance(t *testing.T) {
	ctx := context.Background()
	gw := vgwtest.New(t)
	gw.SetEnv(t)
	st, err := s3.Open(gw.URL("conformance"))
	if err != nil {
		t.Fatal(err)
	}
	objtest.Run(t, st, 2*s3.PartSize+12345)

	t.Run("WrongCredentials", func(t *testing.T) {
		t.Setenv("AWS_SECRET_ACCESS_KEY", "wrong")
		bad, err := s3.Open(gw.URL("conformance"))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := bad.Stat(ctx, "x"); !errors.Is(err, errdefs.ErrPermission) {
			t.Fatalf("stat with a wrong secret: %v, want ErrPermission", err)
		}
	})
	t.Run("CredentialsFile", func(t *testing.T) {
		t.Setenv("AWS_ACCESS_KEY_ID", "")
		t.Setenv("AWS_SECRET_ACCESS_KEY", "")
		f := t.TempDir() + "/credentials"
		os.WriteFile(f, []byte("[default]\naws_access_key_id = "+gw.AccessKey+"\naws_secret_access_key = "+gw.SecretKey+"\n"), 0o600)
		fs, err := s3.Open(gw.URL("conformance") + "&credentials-file=" + f)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := fs.Stat(ctx, "a/small"); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("StoreDown", func(t *testing.T) {
		gw.Stop()
		defer gw.Start(ctx)
		if _, err := st.Stat(ctx, "a/small"); !errors.Is(err, errdefs.ErrUnavailable) {
			t.Fatalf("stat with the store down: %v, want ErrUnavailable", err)
		}
	})
}
