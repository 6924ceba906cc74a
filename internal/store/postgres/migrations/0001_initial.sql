-- The schema of SQLite's migrations up to its version 1 and the key columns
-- (last use, revocation, generation), in PostgreSQL's types: times are
-- timestamptz, specs jsonb.
CREATE TABLE projects (
	id         TEXT PRIMARY KEY,
	slug       TEXT NOT NULL UNIQUE,
	name       TEXT NOT NULL,
	created_at TIMESTAMPTZ NOT NULL DEFAULT now()
);
CREATE TABLE api_keys (
	id           TEXT PRIMARY KEY,
	project_id   TEXT NOT NULL REFERENCES projects(id),
	hash         TEXT NOT NULL UNIQUE,
	prefix       TEXT NOT NULL,
	created_at   TIMESTAMPTZ NOT NULL DEFAULT now(),
	last_used_at TIMESTAMPTZ,
	revoked_at   TIMESTAMPTZ
);
CREATE INDEX api_keys_project ON api_keys(project_id);
CREATE TABLE key_generation (
	one INTEGER PRIMARY KEY CHECK (one = 1),
	n   BIGINT NOT NULL
);
INSERT INTO key_generation(one, n) VALUES(1, 0);
CREATE TABLE sandboxes (
	id          TEXT PRIMARY KEY,
	project_id  TEXT NOT NULL REFERENCES projects(id),
	template    TEXT NOT NULL,
	size        TEXT NOT NULL,
	status      TEXT NOT NULL,
	spec        JSONB NOT NULL,
	started_at  TIMESTAMPTZ NOT NULL,
	end_at      TIMESTAMPTZ,
	pause_error TEXT
);
CREATE INDEX sandboxes_project ON sandboxes(project_id);
CREATE TABLE snapshots (
	id         TEXT PRIMARY KEY,
	project_id TEXT NOT NULL REFERENCES projects(id),
	spec       JSONB NOT NULL,
	created_at TIMESTAMPTZ NOT NULL
);
CREATE INDEX snapshots_project ON snapshots(project_id);
CREATE TABLE volumes (
	id         TEXT PRIMARY KEY,
	project_id TEXT NOT NULL REFERENCES projects(id),
	name       TEXT NOT NULL,
	spec       JSONB NOT NULL,
	created_at TIMESTAMPTZ NOT NULL,
	UNIQUE(project_id, name)
);
