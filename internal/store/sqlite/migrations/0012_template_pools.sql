-- Template warm pools: each node keeps size sandboxes of project_id's
-- template (a built-in one or the project's own) booted at sandbox_size (a
-- size name, resolved: never '') for the project's creates. A size of 0 is
-- no row. updated_at is when the setting was last made.
CREATE TABLE template_pools (
	project_id   TEXT    NOT NULL,
	template     TEXT    NOT NULL,
	sandbox_size TEXT    NOT NULL,
	size         INTEGER NOT NULL CHECK (size > 0),
	updated_at   TEXT    NOT NULL,
	PRIMARY KEY (project_id, template, sandbox_size)
);
