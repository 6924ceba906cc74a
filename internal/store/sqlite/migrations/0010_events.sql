-- Lifecycle events and webhooks (internal/events, internal/webhook). The
-- event log: seq orders it (AUTOINCREMENT: never reused, so a reader's
-- position stays valid after pruning), id is the event's stable id, data
-- the event as clients read it. Times are Unix nanoseconds, compared as
-- numbers.
CREATE TABLE events (
	seq        INTEGER PRIMARY KEY AUTOINCREMENT,
	id         TEXT NOT NULL UNIQUE,
	project_id TEXT NOT NULL,
	sandbox_id TEXT NOT NULL DEFAULT '',
	type       TEXT NOT NULL,
	at         INTEGER NOT NULL,
	data       TEXT NOT NULL
);
CREATE INDEX events_project ON events(project_id, seq);
CREATE INDEX events_at ON events(at);
-- A project's webhooks: types is a JSON array ([]: every type); secret
-- signs the deliveries (kept in clear: it is needed to sign).
CREATE TABLE webhooks (
	id         TEXT PRIMARY KEY,
	project_id TEXT NOT NULL REFERENCES projects(id),
	url        TEXT NOT NULL,
	types      TEXT NOT NULL DEFAULT '[]',
	secret     TEXT NOT NULL,
	created_at INTEGER NOT NULL
);
CREATE INDEX webhooks_project ON webhooks(project_id);
-- One event on its way to one webhook, with a copy of the body (it
-- outlives the event's retention while retried). claim is the token of
-- the node process that holds it until claim_until (claim_node and
-- claim_inc: that node's name and incarnation).
CREATE TABLE webhook_deliveries (
	id          TEXT PRIMARY KEY,
	webhook_id  TEXT NOT NULL REFERENCES webhooks(id) ON DELETE CASCADE,
	project_id  TEXT NOT NULL,
	event_id    TEXT NOT NULL,
	event_type  TEXT NOT NULL,
	body        TEXT NOT NULL,
	state       TEXT NOT NULL,
	attempts    INTEGER NOT NULL DEFAULT 0,
	created_at  INTEGER NOT NULL,
	updated_at  INTEGER NOT NULL,
	next_at     INTEGER NOT NULL,
	claim       TEXT NOT NULL DEFAULT '',
	claim_node  TEXT NOT NULL DEFAULT '',
	claim_inc   INTEGER NOT NULL DEFAULT 0,
	claim_until INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX webhook_deliveries_due ON webhook_deliveries(state, next_at);
CREATE INDEX webhook_deliveries_webhook ON webhook_deliveries(webhook_id, created_at);
CREATE TABLE webhook_attempts (
	delivery_id TEXT NOT NULL REFERENCES webhook_deliveries(id) ON DELETE CASCADE,
	n           INTEGER NOT NULL,
	at          INTEGER NOT NULL,
	status_code INTEGER NOT NULL DEFAULT 0,
	error       TEXT NOT NULL DEFAULT '',
	duration_ms INTEGER NOT NULL DEFAULT 0,
	PRIMARY KEY (delivery_id, n)
);
