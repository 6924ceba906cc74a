-- Per-project limits: a NULL column is the server's default. settings
-- holds what the server records for the CLI (its default limits).
CREATE TABLE project_limits (
	project_id    TEXT PRIMARY KEY REFERENCES projects(id),
	max_sandboxes INTEGER,
	max_vcpus     INTEGER,
	max_memory_gb INTEGER,
	max_volume_gb INTEGER,
	max_snapshots INTEGER
);
CREATE TABLE settings (
	key   TEXT PRIMARY KEY,
	value JSONB NOT NULL
);
