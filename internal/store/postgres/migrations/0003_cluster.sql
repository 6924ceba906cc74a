-- Cluster mode: one row per node with its lease (on this database's clock)
-- and incarnation; gone is '' while it is a member, 'dead' or 'removed'
-- after. Sandbox rows carry their node and what they reserve; snapshots and
-- volumes the node whose disk holds them. '' is a single server's.
CREATE TABLE nodes (
	name          TEXT PRIMARY KEY,
	address       TEXT NOT NULL,
	incarnation   BIGINT NOT NULL,
	gone          TEXT NOT NULL DEFAULT '',
	draining      BOOLEAN NOT NULL DEFAULT false,
	runsc_build   TEXT NOT NULL DEFAULT '',
	vcpus         DOUBLE PRECISION NOT NULL DEFAULT 0,
	memory_mb     BIGINT NOT NULL DEFAULT 0,
	max_sandboxes INTEGER NOT NULL DEFAULT 0,
	templates     JSONB NOT NULL DEFAULT '[]',
	lease_until   TIMESTAMPTZ NOT NULL,
	heartbeat_at  TIMESTAMPTZ NOT NULL,
	joined_at     TIMESTAMPTZ NOT NULL
);
ALTER TABLE sandboxes ADD COLUMN node TEXT NOT NULL DEFAULT '';
ALTER TABLE sandboxes ADD COLUMN cpus DOUBLE PRECISION NOT NULL DEFAULT 0;
ALTER TABLE sandboxes ADD COLUMN memory_mb BIGINT NOT NULL DEFAULT 0;
CREATE INDEX sandboxes_node ON sandboxes(node);
ALTER TABLE snapshots ADD COLUMN node TEXT NOT NULL DEFAULT '';
ALTER TABLE volumes ADD COLUMN node TEXT NOT NULL DEFAULT '';
