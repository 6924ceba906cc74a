package main

import (
	"fmt"
	"log/slog"

	"github.com/lizard-build/lizard/internal/durable"
	"github.com/lizard-build/lizard/internal/objstore/s3"
	"github.com/lizard-build/lizard/internal/sandbox"
)

const objectStoreUsage = "object store that makes pause images and snapshots durable: " +
	"s3://BUCKET[/PREFIX]?endpoint=HOST:PORT&region=R[&insecure=true][&credentials-file=F][&profile=P][&path-style=true]; " +
	"credentials from AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, else the shared credentials file " +
	"(credentials-file=, AWS_SHARED_CREDENTIALS_FILE or ~/.aws/credentials); \"\" keeps them only on the local disk"

// openImages opens the durable images of --object-store; nil (no object
// store) when raw is "".
func openImages(raw string, log *slog.Logger) (sandbox.Images, error) {
	if raw == "" {
		return nil, nil
	}
	obj, err := s3.Open(raw)
	if err != nil {
		return nil, fmt.Errorf("--object-store: %w", err)
	}
	log.Info("object store", "url", obj.String())
	return durable.New(obj, log), nil
}
