-- Sandbox schedules (internal/sandbox/schedule) and their runs. A
-- schedule goes with its sandbox's row (ON DELETE CASCADE: a killed
-- sandbox's schedules go with it) and its runs with it. A migration that
-- rebuilds the sandboxes table must keep these rows (copy them aside, or
-- turn foreign keys off around it), since dropping the table deletes its
-- rows one by one and the deletes cascade. next_run_at is the next due
-- time; run_requested a run asked for now; a run's (schedule_id, due_at)
-- is unique: a due time runs once.
CREATE TABLE schedules (
	id                   TEXT PRIMARY KEY,
	project_id           TEXT NOT NULL,
	sandbox_id           TEXT NOT NULL REFERENCES sandboxes(id) ON DELETE CASCADE,
	spec                 TEXT NOT NULL,
	enabled              INTEGER NOT NULL,
	disabled_reason      TEXT NOT NULL DEFAULT '',
	next_run_at          TEXT,
	run_requested        TEXT,
	last_run_at          TEXT,
	last_status          TEXT NOT NULL DEFAULT '',
	consecutive_failures INTEGER NOT NULL DEFAULT 0,
	skipped_count        INTEGER NOT NULL DEFAULT 0,
	created_at           TEXT NOT NULL
);
CREATE INDEX schedules_project ON schedules(project_id, sandbox_id);
CREATE INDEX schedules_due ON schedules(next_run_at) WHERE enabled = 1;
CREATE TABLE schedule_runs (
	id          TEXT PRIMARY KEY,
	schedule_id TEXT NOT NULL REFERENCES schedules(id) ON DELETE CASCADE,
	sandbox_id  TEXT NOT NULL,
	project_id  TEXT NOT NULL,
	node        TEXT NOT NULL DEFAULT '',
	due_at      TEXT NOT NULL,
	status      TEXT NOT NULL,
	woke        INTEGER NOT NULL DEFAULT 0,
	slept       INTEGER NOT NULL DEFAULT 0,
	started_at  TEXT NOT NULL,
	ended_at    TEXT,
	exit_code   INTEGER,
	output      TEXT NOT NULL DEFAULT '',
	error       TEXT NOT NULL DEFAULT '',
	duration_ms INTEGER,
	UNIQUE (schedule_id, due_at)
);
CREATE INDEX schedule_runs_running ON schedule_runs(status, node);
ALTER TABLE project_limits ADD COLUMN max_schedules INTEGER;
ALTER TABLE project_limits ADD COLUMN max_schedules_per_sandbox INTEGER;
