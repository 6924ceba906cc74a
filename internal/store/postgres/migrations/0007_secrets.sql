-- Secrets (internal/secrets): a project's named values, write-only through
-- the API. value is sealed (internal/seal: AES-256-GCM under the operator's
-- key, bound to the project and the secret's id); only the current version
-- is kept. metadata is the customer's JSON object of strings.
CREATE TABLE secrets (
	id         TEXT PRIMARY KEY,
	project_id TEXT NOT NULL REFERENCES projects(id),
	name       TEXT NOT NULL,
	version    BIGINT NOT NULL,
	value      BYTEA NOT NULL,
	metadata   JSONB NOT NULL DEFAULT '{}',
	created_at TIMESTAMPTZ NOT NULL,
	updated_at TIMESTAMPTZ NOT NULL,
	UNIQUE (project_id, name)
);
