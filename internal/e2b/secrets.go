package e2b

import (
	"time"

	"github.com/lizard-build/lizard/internal/secrets"
)

// secret is E2B's Secret: metadata only, never the value. E2B's /secrets
// routes are api.SecretRoutes with this shape.
type secret struct {
	SecretID       string            `json:"secretID"`
	Name           string            `json:"name"`
	CurrentVersion int64             `json:"currentVersion"`
	Metadata       map[string]string `json:"metadata"`
	CreatedAt      string            `json:"createdAt"`
	UpdatedAt      string            `json:"updatedAt"`
}

func secretOf(s secrets.Info) secret {
	return secret{SecretID: s.ID, Name: s.Name, CurrentVersion: s.Version, Metadata: s.Metadata,
		CreatedAt: s.CreatedAt.UTC().Format(time.RFC3339Nano), UpdatedAt: s.UpdatedAt.UTC().Format(time.RFC3339Nano)}
}
