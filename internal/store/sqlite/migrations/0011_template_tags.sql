-- Templates' tags (E2B's API: Template.build(t, "name:tag"), assignTags):
-- which build of project_id's template each tag names. created_at is when
-- the tag was last given.
CREATE TABLE template_tags (
	project_id TEXT NOT NULL,
	template   TEXT NOT NULL,
	tag        TEXT NOT NULL,
	build_id   TEXT NOT NULL,
	created_at TEXT        NOT NULL,
	PRIMARY KEY (project_id, template, tag)
);
