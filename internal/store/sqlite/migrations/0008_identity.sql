-- Workload identity (internal/identity). oidc_keys: the cluster's token
-- signing keys, one generation after another; private_key is sealed
-- (internal/seal), public_key is the PKIX DER of its public half. A key
-- signs from activate_at until the next generation's activate_at, and stays
-- published until the tokens it signed expired. sandbox_tokens: the tokens a
-- sandbox registered at its create (E2B's iam.tokens), gone with the
-- sandbox's record.
CREATE TABLE oidc_keys (
	id          TEXT PRIMARY KEY,
	generation  INTEGER NOT NULL UNIQUE,
	algorithm   TEXT NOT NULL,
	public_key  BLOB NOT NULL,
	private_key BLOB NOT NULL,
	created_at  TEXT NOT NULL,
	activate_at TEXT NOT NULL
);
CREATE TABLE sandbox_tokens (
	sandbox_id  TEXT NOT NULL REFERENCES sandboxes(id) ON DELETE CASCADE,
	project_id  TEXT NOT NULL,
	name        TEXT NOT NULL,
	audience    TEXT NOT NULL,
	token_type  TEXT NOT NULL,
	lifetime_s  INTEGER NOT NULL,
	PRIMARY KEY (sandbox_id, name)
);
