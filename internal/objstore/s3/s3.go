// Package s3 is the objstore backend for S3 and S3-compatible stores
// (versitygw, MinIO, Ceph RGW, R2, …), on minio-go: a small, well-kept
// client that streams uploads of unknown length in parts with a bounded
// buffer, which is what checkpoint images need. (aws-sdk-go-v2 would do
// too, but pulls a dozen modules and needs its transfer manager for the
// same streaming.)
package s3

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"

	"github.com/minio/minio-go/v7"
	"github.com/minio/minio-go/v7/pkg/credentials"
	"go.opentelemetry.io/otel/attribute"

	"github.com/lizard-build/lizard/internal/errdefs"
	"github.com/lizard-build/lizard/internal/objstore"
	"github.com/lizard-build/lizard/internal/tracing"
)

// PartSize is the part of a streamed upload held in memory at a time.
const PartSize = 16 << 20

// Config is where the bucket is and how to sign requests.
type Config struct {
	Bucket   string
	Endpoint string // host[:port]; "" is AWS (s3.amazonaws.com)
	Region   string
	Insecure bool // plain http
	// Prefix is put before every key, so that several servers or tests can
	// share a bucket.
	Prefix string
	// AccessKey/SecretKey when set; otherwise the environment
	// (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN), then
	// the shared credentials file (CredentialsFile, or
	// AWS_SHARED_CREDENTIALS_FILE, or ~/.aws/credentials) with Profile.
	AccessKey, SecretKey string
	CredentialsFile      string
	Profile              string
	// PathStyle forces bucket-in-path URLs (the default picks them for
	// endpoints other than AWS).
	PathStyle bool
}

// ParseURL reads s3://BUCKET[/PREFIX]?endpoint=HOST[:PORT]&region=R
// &insecure=true&credentials-file=F&profile=P&path-style=true. An endpoint
// written as http://… implies insecure=true.
func ParseURL(raw string) (Config, error) {
	var c Config
	u, err := url.Parse(raw)
	if err != nil {
		return c, fmt.Errorf("object store URL: %w", errdefs.ErrInvalid)
	}
	if u.Scheme != "s3" || u.Host == "" {
		return c, fmt.Errorf("object store URL %q: want s3://BUCKET?endpoint=…: %w", raw, errdefs.ErrInvalid)
	}
	c.Bucket = u.Host
	c.Prefix = strings.Trim(u.Path, "/")
	if c.Prefix != "" {
		c.Prefix += "/"
	}
	q := u.Query()
	for k := range q {
		switch k {
		case "endpoint", "region", "insecure", "credentials-file", "profile", "path-style":
		default:
			return c, fmt.Errorf("object store URL: unknown parameter %q (endpoint, region, insecure, credentials-file, profile, path-style): %w", k, errdefs.ErrInvalid)
		}
	}
	c.Endpoint = q.Get("endpoint")
	if ep, ok := strings.CutPrefix(c.Endpoint, "http://"); ok {
		c.Endpoint, c.Insecure = ep, true
	} else {
		c.Endpoint = strings.TrimPrefix(c.Endpoint, "https://")
	}
	c.Endpoint = strings.TrimSuffix(c.Endpoint, "/")
	c.Region = q.Get("region")
	c.CredentialsFile = q.Get("credentials-file")
	c.Profile = q.Get("profile")
	for _, b := range []struct {
		name string
		to   *bool
	}{{"insecure", &c.Insecure}, {"path-style", &c.PathStyle}} {
		if v := q.Get(b.name); v != "" {
			on, err := strconv.ParseBool(v)
			if err != nil {
				return c, fmt.Errorf("object store URL: %s=%q is not true or false: %w", b.name, v, errdefs.ErrInvalid)
			}
			*b.to = *b.to || on
		}
	}
	return c, nil
}

// Store is a bucket.
type Store struct {
	c      *minio.Client
	bucket string
	prefix string
}

var _ objstore.Store = (*Store)(nil)

// New makes a client of cfg's bucket. It does not connect: a store that is
// down at start fails the first call, not the server.
func New(cfg Config) (*Store, error) {
	if cfg.Bucket == "" {
		return nil, fmt.Errorf("object store: no bucket: %w", errdefs.ErrInvalid)
	}
	ep := cfg.Endpoint
	if ep == "" {
		ep = "s3.amazonaws.com"
	}
	var creds *credentials.Credentials
	if cfg.AccessKey != "" {
		creds = credentials.NewStaticV4(cfg.AccessKey, cfg.SecretKey, "")
	} else {
		creds = credentials.NewChainCredentials([]credentials.Provider{
			&credentials.EnvAWS{},
			&credentials.FileAWSCredentials{Filename: cfg.CredentialsFile, Profile: cfg.Profile},
		})
	}
	if cfg.CredentialsFile != "" {
		if _, err := os.Stat(cfg.CredentialsFile); err != nil {
			return nil, fmt.Errorf("object store credentials file: %w", errors.Join(err, errdefs.ErrInvalid))
		}
	}
	lookup := minio.BucketLookupAuto
	if cfg.PathStyle {
		lookup = minio.BucketLookupPath
	}
	c, err := minio.New(ep, &minio.Options{
		Creds:        creds,
		Secure:       !cfg.Insecure,
		Region:       cfg.Region,
		BucketLookup: lookup,
		// A few quick retries; the callers retry longer outages themselves
		// (durable uploads back off up to a minute).
		MaxRetries: 3,
	})
	if err != nil {
		return nil, fmt.Errorf("object store: %w", errors.Join(err, errdefs.ErrInvalid))
	}
	return &Store{c: c, bucket: cfg.Bucket, prefix: cfg.Prefix}, nil
}

// Open is New of ParseURL(raw).
func Open(raw string) (*Store, error) {
	cfg, err := ParseURL(raw)
	if err != nil {
		return nil, err
	}
	return New(cfg)
}

// String names the bucket (no credentials).
func (s *Store) String() string { return "s3://" + s.bucket + "/" + s.prefix }

// objectKey is the attribute of an object's key in spans (keys are
// content digests and image names, never contents).
const objectKey = attribute.Key("lizard.object.key")

// Put implements objstore.Store.
func (s *Store) Put(ctx context.Context, key string, r io.Reader) (_ objstore.Info, err error) {
	ctx, span := tracing.StartClient(ctx, "objstore put", objectKey.String(key))
	defer func() { tracing.End(span, err) }()
	size := int64(-1)
	if l, ok := r.(interface{ Len() int }); ok {
		// In memory already (bytes.Buffer, bytes.Reader): one request, no
		// part buffer.
		size = int64(l.Len())
	}
	info, err := s.c.PutObject(ctx, s.bucket, s.prefix+key, r, size, minio.PutObjectOptions{
		PartSize:    PartSize,
		ContentType: "application/octet-stream",
	})
	if err != nil {
		return objstore.Info{}, classify("put", key, err)
	}
	span.SetAttributes(tracing.Bytes.Int64(info.Size))
	return objstore.Info{Key: key, Size: info.Size, Modified: info.LastModified}, nil
}

// Get implements objstore.Store.
func (s *Store) Get(ctx context.Context, key string, off, n int64) (_ io.ReadCloser, err error) {
	// Until the answer's headers: the bytes are read by the caller.
	ctx, span := tracing.StartClient(ctx, "objstore get", objectKey.String(key))
	defer func() { tracing.End(span, err) }()
	var opts minio.GetObjectOptions
	if off < 0 || n == 0 {
		return nil, fmt.Errorf("get %q: range %d+%d: %w", key, off, n, errdefs.ErrInvalid)
	}
	if off > 0 || n > 0 {
		end := int64(0) // to the end
		if n > 0 {
			end = off + n - 1
		}
		if err := opts.SetRange(off, end); err != nil {
			return nil, fmt.Errorf("get %q: %w", key, errors.Join(err, errdefs.ErrInvalid))
		}
	}
	obj, err := s.c.GetObject(ctx, s.bucket, s.prefix+key, opts)
	if err != nil {
		return nil, classify("get", key, err)
	}
	// The request is made by the first call on obj: Stat makes it here, so
	// that a missing key is an error of Get and not of the first Read.
	if _, err := obj.Stat(); err != nil {
		obj.Close()
		return nil, classify("get", key, err)
	}
	return obj, nil
}

// Stat implements objstore.Store.
func (s *Store) Stat(ctx context.Context, key string) (objstore.Info, error) {
	oi, err := s.c.StatObject(ctx, s.bucket, s.prefix+key, minio.StatObjectOptions{})
	if err != nil {
		return objstore.Info{}, classify("stat", key, err)
	}
	return objstore.Info{Key: key, Size: oi.Size, Modified: oi.LastModified}, nil
}

// Delete implements objstore.Store.
func (s *Store) Delete(ctx context.Context, key string) error {
	if err := s.c.RemoveObject(ctx, s.bucket, s.prefix+key, minio.RemoveObjectOptions{}); err != nil {
		if err := classify("delete", key, err); !errors.Is(err, errdefs.ErrNotFound) {
			return err
		}
	}
	return nil
}

// List implements objstore.Store.
func (s *Store) List(ctx context.Context, prefix string, fn func(objstore.Info) error) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel() // stops the listing goroutine when fn fails
	for oi := range s.c.ListObjects(ctx, s.bucket, minio.ListObjectsOptions{Prefix: s.prefix + prefix, Recursive: true}) {
		if oi.Err != nil {
			return classify("list", prefix, oi.Err)
		}
		if err := fn(objstore.Info{Key: strings.TrimPrefix(oi.Key, s.prefix), Size: oi.Size, Modified: oi.LastModified}); err != nil {
			return err
		}
	}
	return ctx.Err()
}

// classify gives an S3 error its errdefs class.
func classify(op, key string, err error) error {
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return fmt.Errorf("object store %s %q: %w", op, key, err)
	}
	resp := minio.ToErrorResponse(err)
	var class error
	switch {
	case resp.Code == minio.NoSuchKey || resp.Code == minio.NoSuchBucket || resp.StatusCode == http.StatusNotFound:
		class = errdefs.ErrNotFound
	case resp.Code == minio.InvalidRange || resp.StatusCode == http.StatusRequestedRangeNotSatisfiable:
		class = errdefs.ErrInvalid
	case resp.Code == "AccessDenied" || resp.Code == "InvalidAccessKeyId" || resp.Code == "SignatureDoesNotMatch" || resp.StatusCode == http.StatusForbidden:
		class = errdefs.ErrPermission
	default:
		var ne net.Error
		if errors.As(err, &ne) || resp.StatusCode >= 500 || resp.StatusCode == 0 {
			class = errdefs.ErrUnavailable
		}
	}
	if class == nil {
		return fmt.Errorf("object store %s %q: %w", op, key, err)
	}
	return fmt.Errorf("object store %s %q: %w", op, key, errors.Join(err, class))
}
