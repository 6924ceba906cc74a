-- Cluster mode: one row per node with its lease and incarnation; gone is
-- '' while it is a member, 'dead' or 'removed' after. Times of the lease
-- are Unix nanoseconds, compared as numbers. Sandbox rows carry their node
-- and what they reserve; snapshots and volumes the node whose disk holds
-- them. '' is a single server's.
CREATE TABLE nodes (
	name          TEXT PRIMARY KEY,
	address       TEXT NOT NULL,
	incarnation   INTEGER NOT NULL,
	gone          TEXT NOT NULL DEFAULT '',
	draining      INTEGER NOT NULL DEFAULT 0,
	runsc_build   TEXT NOT NULL DEFAULT '',
	vcpus         REAL NOT NULL DEFAULT 0,
	memory_mb     INTEGER NOT NULL DEFAULT 0,
	max_sandboxes INTEGER NOT NULL DEFAULT 0,
	templates     TEXT NOT NULL DEFAULT '[]',
	lease_until   INTEGER NOT NULL,
	heartbeat_at  INTEGER NOT NULL,
	joined_at     INTEGER NOT NULL
);
ALTER TABLE sandboxes ADD COLUMN node TEXT NOT NULL DEFAULT '';
ALTER TABLE sandboxes ADD COLUMN cpus REAL NOT NULL DEFAULT 0;
ALTER TABLE sandboxes ADD COLUMN memory_mb INTEGER NOT NULL DEFAULT 0;
CREATE INDEX sandboxes_node ON sandboxes(node);
ALTER TABLE snapshots ADD COLUMN node TEXT NOT NULL DEFAULT '';
ALTER TABLE volumes ADD COLUMN node TEXT NOT NULL DEFAULT '';
