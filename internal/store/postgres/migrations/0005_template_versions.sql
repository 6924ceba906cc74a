-- Templates everywhere (--object-store): which version (content digest) is
-- current for each template name, per project ('' for the built-in
-- templates), published by the node that built it. info is the template's
-- metadata as nodes list it; updated_at is when it was published.
CREATE TABLE template_versions (
	project_id TEXT NOT NULL,
	name       TEXT NOT NULL,
	digest     TEXT NOT NULL,
	info       JSONB NOT NULL DEFAULT '{}',
	node       TEXT NOT NULL DEFAULT '',
	updated_at TIMESTAMPTZ NOT NULL,
	PRIMARY KEY (project_id, name)
);
