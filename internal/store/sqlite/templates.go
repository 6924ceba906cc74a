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
