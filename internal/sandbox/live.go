package sandbox

import (
	"context"
	"maps"
	"slices"
)

// The seam of the feature packages (internal/sandbox/preview, desktop, …):
// they keep their state of a sandbox in its record through Update and read
// the live table through Live and EachLive, and hold no pointer into the
// service.

// Live returns the record of a sandbox of any project that is in the live
// table, not being removed and not a pooled copy. It only reads the table.
func (s *Service) Live(id string) (Record, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	e, ok := s.sandboxes[id]
	if !ok || e.gone || e.rec.Status == StatusPooled {
		return Record{}, false
	}
	return e.rec.clone(), true
}

// EachLive calls fn with the record of every sandbox Live would return,
// with the live table locked: fn must not call the service.
func (s *Service) EachLive(fn func(Record)) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, e := range s.sandboxes {
		if !e.gone && e.rec.Status != StatusPooled {
			fn(e.rec)
		}
	}
}

// Update changes the record of project's sandbox id with fn, under the
// sandbox's lifecycle lock, and persists it: how a feature keeps its own
// fields of a sandbox (a preview's ports and tokens, the desktop's size).
// fn gets a copy it may change as it likes and runs with the live table
// locked, so it must not call the service; when it fails nothing changes.
// A sandbox killed meanwhile is ErrNotFound, never brought back.
func (s *Service) Update(ctx context.Context, projectID, id string, fn func(*Record) error) (Record, error) {
	e, err := s.lockLive(projectID, id)
	if err != nil {
		return Record{}, err
	}
	defer e.mu.Unlock()
	rec := e.rec.clone()
	if err := fn(&rec); err != nil {
		s.mu.Unlock()
		return Record{}, err
	}
	e.rec = rec
	s.mu.Unlock()
	return rec.clone(), s.persist(ctx, rec)
}

// clone copies the record's slices and maps, so that a copy handed out
// can be changed without changing the table's.
func (r Record) clone() Record {
	r.Metadata = maps.Clone(r.Metadata)
	r.Envs = maps.Clone(r.Envs)
	r.Ports = slices.Clone(r.Ports)
	r.PortTokens = maps.Clone(r.PortTokens)
	r.Egress.Allowed = slices.Clone(r.Egress.Allowed)
	if r.Desktop != nil {
		d := *r.Desktop
		r.Desktop = &d
	}
	return r
}
