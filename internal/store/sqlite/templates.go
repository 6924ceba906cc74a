package sqlite

import (
	"context"
	"encoding/json"
	"time"

	"github.com/lizard-build/lizard/internal/store"
)

var _ store.TemplateVersions = (*Store)(nil)

// PutTemplateVersion records v as the current version of its name.
func (s *Store) PutTemplateVersion(ctx context.Context, v store.TemplateVersion) error {
	_, err := s.db.ExecContext(ctx, `INSERT INTO template_versions(project_id, name, digest, info, node, updated_at) VALUES(?,?,?,?,?,?)
		ON CONFLICT(project_id, name) DO UPDATE SET digest = excluded.digest, info = excluded.info, node = excluded.node, updated_at = excluded.updated_at`,
		v.ProjectID, v.Name, v.Digest, string(store.InfoOrEmpty(v.Info)), v.Node, fmtTime(v.UpdatedAt))
	return err
}

// TemplateVersion returns the record of project's template name.
func (s *Store) TemplateVersion(ctx context.Context, projectID, name string) (store.TemplateVersion, error) {
	rows, err := s.templateVersions(ctx, `WHERE project_id = ? AND name = ?`, projectID, name)
	if err != nil {
		return store.TemplateVersion{}, err
	}
	if len(rows) == 0 {
		return store.TemplateVersion{}, store.TemplateVersionNotFound(projectID, name)
	}
	return rows[0], nil
}

// TemplateVersions lists the records of project's templates, by name.
func (s *Store) TemplateVersions(ctx context.Context, projectID string) ([]store.TemplateVersion, error) {
	return s.templateVersions(ctx, `WHERE project_id = ?`, projectID)
}

func (s *Store) templateVersions(ctx context.Context, where string, args ...any) ([]store.TemplateVersion, error) {
	rows, err := s.db.QueryContext(ctx, `SELECT project_id, name, digest, info, node, updated_at FROM template_versions `+where+` ORDER BY name`, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := []store.TemplateVersion{}
	for rows.Next() {
		var v store.TemplateVersion
		var info, updated string
		if err := rows.Scan(&v.ProjectID, &v.Name, &v.Digest, &info, &v.Node, &updated); err != nil {
			return nil, err
		}
		v.Info = json.RawMessage(info)
		v.UpdatedAt, _ = time.Parse(time.RFC3339Nano, updated)
		out = append(out, v)
	}
	return out, rows.Err()
}

// DeleteTemplateVersion removes a record.
func (s *Store) DeleteTemplateVersion(ctx context.Context, projectID, name string) error {
	_, err := s.db.ExecContext(ctx, `DELETE FROM template_versions WHERE project_id = ? AND name = ?`, projectID, name)
	return err
}

var _ store.TemplateTags = (*Store)(nil)

// AssignTemplateTags makes each of tags name buildID.
func (s *Store) AssignTemplateTags(ctx context.Context, projectID, template, buildID string, tags []string) error {
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback()
	at := fmtTime(time.Now())
	for _, tag := range tags {
		if _, err := tx.ExecContext(ctx, `INSERT INTO template_tags(project_id, template, tag, build_id, created_at) VALUES(?,?,?,?,?)
			ON CONFLICT(project_id, template, tag) DO UPDATE SET build_id = excluded.build_id, created_at = excluded.created_at`,
			projectID, template, tag, buildID, at); err != nil {
			return err
		}
	}
	return tx.Commit()
}

// TemplateTags lists the tags of project's template, by tag.
func (s *Store) TemplateTags(ctx context.Context, projectID, template string) ([]store.TemplateTag, error) {
	rows, err := s.db.QueryContext(ctx, `SELECT project_id, template, tag, build_id, created_at FROM template_tags
		WHERE project_id = ? AND template = ? ORDER BY tag`, projectID, template)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := []store.TemplateTag{}
	for rows.Next() {
		var t store.TemplateTag
		var at string
		if err := rows.Scan(&t.ProjectID, &t.Template, &t.Tag, &t.BuildID, &at); err != nil {
			return nil, err
		}
		t.CreatedAt, _ = time.Parse(time.RFC3339Nano, at)
		out = append(out, t)
	}
	return out, rows.Err()
}

// DeleteTemplateTags removes tags of project's template (all for nil).
func (s *Store) DeleteTemplateTags(ctx context.Context, projectID, template string, tags []string) error {
	if tags == nil {
		_, err := s.db.ExecContext(ctx, `DELETE FROM template_tags WHERE project_id = ? AND template = ?`, projectID, template)
		return err
	}
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback()
	for _, tag := range tags {
		if _, err := tx.ExecContext(ctx, `DELETE FROM template_tags WHERE project_id = ? AND template = ? AND tag = ?`, projectID, template, tag); err != nil {
			return err
		}
	}
	return tx.Commit()
}

var _ store.TemplatePools = (*Store)(nil)

// SetTemplatePool records p at now, or removes its row for a Size of 0.
func (s *Store) SetTemplatePool(ctx context.Context, p store.TemplatePool) error {
	if err := store.CheckTemplatePool(p); err != nil {
		return err
	}
	if p.Size == 0 {
		_, err := s.db.ExecContext(ctx, `DELETE FROM template_pools WHERE project_id = ? AND template = ? AND sandbox_size = ?`,
			p.ProjectID, p.Template, p.SandboxSize)
		return err
	}
	_, err := s.db.ExecContext(ctx, `INSERT INTO template_pools(project_id, template, sandbox_size, size, updated_at) VALUES(?,?,?,?,?)
		ON CONFLICT(project_id, template, sandbox_size) DO UPDATE SET size = excluded.size, updated_at = excluded.updated_at`,
		p.ProjectID, p.Template, p.SandboxSize, p.Size, fmtTime(time.Now()))
	return err
}

// TemplatePools lists every project's settings, by project, template and
// sandbox size.
func (s *Store) TemplatePools(ctx context.Context) ([]store.TemplatePool, error) {
	rows, err := s.db.QueryContext(ctx, `SELECT project_id, template, sandbox_size, size, updated_at FROM template_pools
		ORDER BY project_id, template, sandbox_size`)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := []store.TemplatePool{}
	for rows.Next() {
		var p store.TemplatePool
		var at string
		if err := rows.Scan(&p.ProjectID, &p.Template, &p.SandboxSize, &p.Size, &at); err != nil {
			return nil, err
		}
		p.UpdatedAt, _ = time.Parse(time.RFC3339Nano, at)
		out = append(out, p)
	}
	return out, rows.Err()
}
