-- The schema before versioning; IF NOT EXISTS so that databases made before
-- it existed take this version as they are.
CREATE TABLE IF NOT EXISTS projects (
	id         TEXT PRIMARY KEY,
	slug       TEXT NOT NULL UNIQUE,
	name       TEXT NOT NULL,
	created_at TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS api_keys (
	id         TEXT PRIMARY KEY,
	project_id TEXT NOT NULL REFERENCES projects(id),
	hash       TEXT NOT NULL UNIQUE,
	prefix     TEXT NOT NULL,
	created_at TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS sandboxes (
	id          TEXT PRIMARY KEY,
	project_id  TEXT NOT NULL REFERENCES projects(id),
	template    TEXT NOT NULL,
	size        TEXT NOT NULL,
	status      TEXT NOT NULL,
	spec        TEXT NOT NULL,
	started_at  TEXT NOT NULL,
	end_at      TEXT,
	pause_error TEXT
);
CREATE INDEX IF NOT EXISTS sandboxes_project ON sandboxes(project_id);
CREATE TABLE IF NOT EXISTS snapshots (
	id         TEXT PRIMARY KEY,
	project_id TEXT NOT NULL REFERENCES projects(id),
	spec       TEXT NOT NULL,
	created_at TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS snapshots_project ON snapshots(project_id);
CREATE TABLE IF NOT EXISTS volumes (
	id         TEXT PRIMARY KEY,
	project_id TEXT NOT NULL REFERENCES projects(id),
	name       TEXT NOT NULL,
	spec       TEXT NOT NULL,
	created_at TEXT NOT NULL,
	UNIQUE(project_id, name)
);
