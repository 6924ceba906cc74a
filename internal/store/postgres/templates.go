package postgres

import (
	"context"
	"encoding/json"

	"github.com/jackc/pgx/v5"

	"github.com/lizard-build/lizard/internal/store"
)

var _ store.TemplateVersions = (*Store)(nil)

// PutTemplateVersion records v as the current version of its name.
func (s *Store) PutTemplateVersion(ctx context.Context, v store.TemplateVersion) error {
	_, err := s.pool.Exec(ctx, `INSERT INTO template_versions(project_id, name, digest, info, node, updated_at) VALUES($1,$2,$3,$4,$5,$6)
		ON CONFLICT(project_id, name) DO UPDATE SET digest = excluded.digest, info = excluded.info, node = excluded.node, updated_at = excluded.updated_at`,
		v.ProjectID, v.Name, v.Digest, string(store.InfoOrEmpty(v.Info)), v.Node, v.UpdatedAt)
	return err
}

// TemplateVersion returns the record of project's template name.
func (s *Store) TemplateVersion(ctx context.Context, projectID, name string) (store.TemplateVersion, error) {
	out, err := s.templateVersions(ctx, `WHERE project_id = $1 AND name = $2`, projectID, name)
	if err != nil {
		return store.TemplateVersion{}, err
	}
	if len(out) == 0 {
		return store.TemplateVersion{}, store.TemplateVersionNotFound(projectID, name)
	}
	return out[0], nil
}

// TemplateVersions lists the records of project's templates, by name.
func (s *Store) TemplateVersions(ctx context.Context, projectID string) ([]store.TemplateVersion, error) {
	return s.templateVersions(ctx, `WHERE project_id = $1`, projectID)
}

func (s *Store) templateVersions(ctx context.Context, where string, args ...any) ([]store.TemplateVersion, error) {
	rows, _ := s.pool.Query(ctx, `SELECT project_id, name, digest, info::text, node, updated_at FROM template_versions `+where+` ORDER BY name`, args...)
	return collect(rows, func(r pgx.CollectableRow) (v store.TemplateVersion, err error) {
		var info string
		err = r.Scan(&v.ProjectID, &v.Name, &v.Digest, &info, &v.Node, &v.UpdatedAt)
		v.Info, v.UpdatedAt = json.RawMessage(info), v.UpdatedAt.UTC()
		return v, err
	})
}

// DeleteTemplateVersion removes a record.
func (s *Store) DeleteTemplateVersion(ctx context.Context, projectID, name string) error {
	_, err := s.pool.Exec(ctx, `DELETE FROM template_versions WHERE project_id = $1 AND name = $2`, projectID, name)
	return err
}

var _ store.TemplateTags = (*Store)(nil)

// AssignTemplateTags makes each of tags name buildID, at the database's
// time.
func (s *Store) AssignTemplateTags(ctx context.Context, projectID, template, buildID string, tags []string) error {
	_, err := s.pool.Exec(ctx, `INSERT INTO template_tags(project_id, template, tag, build_id, created_at)
		SELECT $1, $2, t, $3, now() FROM unnest($4::text[]) AS t
		ON CONFLICT(project_id, template, tag) DO UPDATE SET build_id = excluded.build_id, created_at = excluded.created_at`,
		projectID, template, buildID, tags)
	return err
}

// TemplateTags lists the tags of project's template, by tag.
func (s *Store) TemplateTags(ctx context.Context, projectID, template string) ([]store.TemplateTag, error) {
	rows, _ := s.pool.Query(ctx, `SELECT project_id, template, tag, build_id, created_at FROM template_tags
		WHERE project_id = $1 AND template = $2 ORDER BY tag COLLATE "C"`, projectID, template)
	return collect(rows, func(r pgx.CollectableRow) (t store.TemplateTag, err error) {
		err = r.Scan(&t.ProjectID, &t.Template, &t.Tag, &t.BuildID, &t.CreatedAt)
		t.CreatedAt = t.CreatedAt.UTC()
		return t, err
	})
}

// DeleteTemplateTags removes tags of project's template (all for nil).
func (s *Store) DeleteTemplateTags(ctx context.Context, projectID, template string, tags []string) error {
	if tags == nil {
		_, err := s.pool.Exec(ctx, `DELETE FROM template_tags WHERE project_id = $1 AND template = $2`, projectID, template)
		return err
	}
	_, err := s.pool.Exec(ctx, `DELETE FROM template_tags WHERE project_id = $1 AND template = $2 AND tag = ANY($3::text[])`, projectID, template, tags)
	return err
}

var _ store.TemplatePools = (*Store)(nil)

// SetTemplatePool records p at the database's time, or removes its row for
// a Size of 0.
func (s *Store) SetTemplatePool(ctx context.Context, p store.TemplatePool) error {
	if err := store.CheckTemplatePool(p); err != nil {
		return err
	}
	if p.Size == 0 {
		_, err := s.pool.Exec(ctx, `DELETE FROM template_pools WHERE project_id = $1 AND template = $2 AND sandbox_size = $3`,
			p.ProjectID, p.Template, p.SandboxSize)
		return err
	}
	_, err := s.pool.Exec(ctx, `INSERT INTO template_pools(project_id, template, sandbox_size, size, updated_at) VALUES($1,$2,$3,$4,now())
		ON CONFLICT(project_id, template, sandbox_size) DO UPDATE SET size = excluded.size, updated_at = excluded.updated_at`,
		p.ProjectID, p.Template, p.SandboxSize, p.Size)
	return err
}

// TemplatePools lists every project's settings, by project, template and
// sandbox size (byte order, as SQLite sorts).
func (s *Store) TemplatePools(ctx context.Context) ([]store.TemplatePool, error) {
	rows, _ := s.pool.Query(ctx, `SELECT project_id, template, sandbox_size, size, updated_at FROM template_pools
		ORDER BY project_id COLLATE "C", template COLLATE "C", sandbox_size COLLATE "C"`)
	return collect(rows, func(r pgx.CollectableRow) (p store.TemplatePool, err error) {
		err = r.Scan(&p.ProjectID, &p.Template, &p.SandboxSize, &p.Size, &p.UpdatedAt)
		p.UpdatedAt = p.UpdatedAt.UTC()
		return p, err
	})
}
