package sandbox

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"path/filepath"
	"strings"
	"time"

	"github.com/lizard-build/lizard/internal/agent"
	"github.com/lizard-build/lizard/internal/errdefs"
	"github.com/lizard-build/lizard/internal/runtime"
	"github.com/lizard-build/lizard/internal/template"
)

// Templates' warm copies: the seam of the feature that keeps templates'
// warm pools (internal/sandbox/tplpool, which decides how many of each to
// keep and refills them). A warm copy is a sandbox of a template booted
// before anyone asked for it (Warm): status pooled, of no project, never
// stored (the feature destroys its copies when the server stops; after a
// crash recovery removes them as strays, and the pools refill), admitted
// against the node's capacity alone. A Create of that template at that
// size, for the project whose pool it is, without a volume, takes one
// (claimWarm): the copy gets the create's project, a fresh agent token,
// its envs, metadata, egress, E2B options and deadline, and is the
// project's from then on. It never ran anyone's code before: its id,
// address and hostname are its own since its boot.

// WarmPrefix begins the PoolOf of every template's warm copy (snapshots'
// copies are pooled under their snapshot's id).
const WarmPrefix = "tpl:"

// WarmKey names the warm copies of tpl (as project sees it, at its
// current version) at size that project's creates take: a new version of
// the template is another key, so copies of the old one are never handed
// out.
func WarmKey(projectID string, tpl template.Template, size string) string {
	version := tpl.Version
	if version == "" {
		version = filepath.Base(tpl.Rootfs)
	}
	return WarmPrefix + projectID + "/" + tpl.Name + "@" + version + "/" + size
}

// ParseWarmKey reads a WarmKey back: ok is false for another kind of
// pool (a snapshot's).
func ParseWarmKey(key string) (projectID, tplName, version, size string, ok bool) {
	rest, ok := strings.CutPrefix(key, WarmPrefix)
	if !ok {
		return "", "", "", "", false
	}
	parts := strings.Split(rest, "/")
	if len(parts) != 3 {
		return "", "", "", "", false
	}
	tplName, version, ok = strings.Cut(parts[1], "@")
	return parts[0], tplName, version, parts[2], ok
}

// CurrentWarmKey is WarmKey of project's template tplName at its current
// version and size ("" for the default): errdefs.ErrNotFound when the
// project has no such template (or it is not built), ErrInvalid for an
// unknown size.
func (s *Service) CurrentWarmKey(projectID, tplName, size string) (string, error) {
	_, _, key, err := s.warmOf(projectID, tplName, size)
	return key, err
}

// warmOf is project's template tplName, the size and the key of its warm
// copies now.
func (s *Service) warmOf(projectID, tplName, size string) (template.Template, Size, string, error) {
	tpl, err := s.cfg.Templates.Lookup(projectID, tplName)
	if err != nil {
		return template.Template{}, Size{}, "", err
	}
	sz, err := LookupSize(size)
	if err != nil {
		return template.Template{}, Size{}, "", err
	}
	return tpl, sz, WarmKey(projectID, tpl, sz.Name), nil
}

// Warm boots a warm copy of project's template tplName at size for
// project's creates, and returns its key (WarmKey). It is admitted against
// the node's capacity only; a template with a start command is restored
// from its ready state (made first if need be), its command running.
func (s *Service) Warm(ctx context.Context, projectID, tplName, size string) (string, error) {
	tpl, sz, key, err := s.warmOf(projectID, tplName, size)
	if err != nil {
		return "", err
	}
	rec := s.newRecord("", tpl.Name, sz, 0)
	rec.Status, rec.PoolOf = StatusPooled, key
	rec.Envs = mergeEnv(tpl.Env, nil)
	rec.User, rec.Workdir, rec.Rootfs = tpl.User, tpl.Workdir, tpl.Rootfs
	if len(tpl.StartCommand) == 0 {
		out, err := s.boot(ctx, rec, tpl, sz, "")
		if err == nil {
			s.prime(ctx, out.ID)
		}
		return key, err
	}
	// The start command runs from the ready state; a copy booted afresh
	// could start it only once claimed.
	if s.ready == nil {
		return "", fmt.Errorf("template %q has a start command, and this server keeps no ready states to restore warm copies from: %w", tpl.Name, errdefs.ErrConflict)
	}
	if _, err := s.PrepareReady(ctx, tpl, sz.Name, nil); err != nil {
		return "", err
	}
	out, done, err := s.createFromReady(ctx, rec, tpl, sz)
	if !done && err == nil {
		err = fmt.Errorf("template %q: its ready state could not be restored: %w", tpl.Name, errdefs.ErrConflict)
	}
	if err == nil {
		s.prime(ctx, out.ID)
	}
	return key, err
}

// prime runs `sh -c true` in warm copy id, as a create's first command
// would, so that what every command needs (the shell's pages, the agent's
// first process) is loaded before a create takes the copy: its first
// command then takes what its later ones do. A failure is only logged.
func (s *Service) prime(ctx context.Context, id string) {
	s.mu.Lock()
	var ag *agent.Client
	if e, ok := s.sandboxes[id]; ok && !e.gone {
		ag = e.agent
	}
	s.mu.Unlock()
	if ag == nil {
		return
	}
	err := ag.Exec(ctx, agent.ExecRequest{Cmd: []string{"true"}, Shell: true, TimeoutMs: 10_000}, func(agent.Event) error { return nil })
	if err != nil {
		s.log.Debug("warm copy: priming command failed", "sandbox", id, "err", err)
	}
}

// claimWarm makes one of the warm copies of want's template at want's size
// for want's project (WarmKey) the sandbox want asks for, if one waits and
// takes what want asks: ok is false otherwise, and then the create boots.
// A copy that cannot be given want's settings is destroyed.
func (s *Service) claimWarm(ctx context.Context, want Record, tpl template.Template) (Record, bool) {
	key := WarmKey(want.ProjectID, tpl, want.Size)
	if !want.Egress.IsZero() {
		if _, ok := s.cfg.Runtime.(runtime.EgressSetter); !ok {
			return Record{}, false
		}
	}
	s.mu.Lock()
	pool := s.pooledLocked(key)
	s.mu.Unlock()
	if len(pool) == 0 {
		return Record{}, false
	}
	lim, err := s.limits(ctx, want.ProjectID)
	if err != nil {
		return Record{}, false
	}
	for _, e := range pool {
		if !e.mu.TryLock() {
			continue
		}
		s.mu.Lock()
		if e.gone || e.rec.Status != StatusPooled || e.rec.PoolOf != key {
			s.mu.Unlock()
			e.mu.Unlock()
			continue
		}
		// The copy holds the node's share already; the project's is
		// judged as a create's would be (a refusal is then the boot's).
		_, projUse := s.usageLocked(want.ProjectID)
		if checkQuota(lim, projUse, holds(StatusRunning, want.CPUs, want.MemoryMB)) != nil {
			s.mu.Unlock()
			e.mu.Unlock()
			return Record{}, false
		}
		// Out of the pool: no other claim or trim takes it, and the API
		// does not show it until it is the project's.
		e.rec.PoolOf = ""
		copyRec, ag := e.rec.clone(), e.agent
		s.mu.Unlock()
		rec, err := s.assign(ctx, copyRec, want, ag)
		if err != nil {
			s.log.Warn("warm copy could not be given a create's settings; destroying it", "sandbox", copyRec.ID, "template", tpl.Name, "err", err)
			if s.take(e) {
				s.destroy(context.WithoutCancel(ctx), copyRec.ID)
			}
			e.mu.Unlock()
			continue
		}
		s.mu.Lock()
		e.rec = rec
		s.armLocked(e)
		s.mu.Unlock()
		err = s.persist(ctx, rec)
		if err != nil {
			s.log.Warn("persist a claimed warm copy; destroying it", "sandbox", rec.ID, "err", err)
			if s.take(e) {
				s.destroy(context.WithoutCancel(ctx), rec.ID)
			}
			e.mu.Unlock()
			if errors.Is(err, errdefs.ErrQuota) || errdefs.Code(err) == "capacity" {
				return Record{}, false
			}
			continue
		}
		e.mu.Unlock()
		s.logs.event(rec.ID, "created from a warm copy of template %s (size %s), booted at %s", rec.Template, rec.Size, copyRec.StartedAt.Format(time.RFC3339))
		s.log.Info("sandbox started from a warm copy", "sandbox", rec.ID, "project", rec.ProjectID, "template", rec.Template, "size", rec.Size)
		s.emit(EventCreated, rec, causeOf(ctx), "template "+rec.Template+" (a warm copy)")
		if fn := s.warmClaimed(); fn != nil {
			fn(key)
		}
		return rec, true
	}
	return Record{}, false
}

// assign gives the warm copy c (its agent ag) what want asks: want's
// project, settings and a new agent token; its id, address, template
// version and resources stay. The caller holds the copy's lifecycle lock.
func (s *Service) assign(ctx context.Context, c, want Record, ag *agent.Client) (Record, error) {
	rec := want
	rec.ID, rec.AgentAddr, rec.AgentVersion, rec.Rootfs = c.ID, c.AgentAddr, c.AgentVersion, c.Rootfs
	rec.Envs, rec.Metadata = maps.Clone(want.Envs), maps.Clone(want.Metadata)
	now := time.Now().UTC()
	rec.StartedAt, rec.EndAt = now, deadline(now, want.TimeoutMs)
	if err := ag.SetToken(ctx, want.AgentToken); err != nil {
		return Record{}, fmt.Errorf("give the warm copy its own agent token: %w", err)
	}
	if err := giveEnvdToken(ctx, ag, rec); err != nil {
		return Record{}, err
	}
	if !rec.Egress.IsZero() {
		if err := s.cfg.Runtime.(runtime.EgressSetter).SetEgress(ctx, rec.ID, rec.Egress); err != nil {
			return Record{}, fmt.Errorf("give the warm copy its network: %w", err)
		}
	}
	return rec, nil
}

// dropWarm destroys one template's warm copy, if any waits, to free the
// node's capacity it holds for a sandbox asked for; it reports whether
// one went.
func (s *Service) dropWarm(ctx context.Context) bool {
	s.mu.Lock()
	var pool []*entry
	for _, e := range s.sandboxes {
		if !e.gone && e.rec.Status == StatusPooled && IsWarmKey(e.rec.PoolOf) {
			pool = append(pool, e)
		}
	}
	s.mu.Unlock()
	for _, e := range pool {
		if !e.mu.TryLock() {
			continue
		}
		s.mu.Lock()
		ok, id := !e.gone && e.rec.Status == StatusPooled && IsWarmKey(e.rec.PoolOf), e.rec.ID
		s.mu.Unlock()
		if ok && s.take(e) {
			s.log.Info("warm copy dropped for a create the node had no room for", "sandbox", id)
			s.destroy(context.WithoutCancel(ctx), id)
			e.mu.Unlock()
			return true
		}
		e.mu.Unlock()
	}
	return false
}

// OnWarmClaimed has fn told the key of every warm copy a create took (the
// pool refills); set once, before serving.
func (s *Service) OnWarmClaimed(fn func(key string)) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.onWarmClaimed = fn
}

func (s *Service) warmClaimed() func(string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.onWarmClaimed
}

// IsWarmKey reports whether poolOf names templates' warm copies.
func IsWarmKey(poolOf string) bool { return strings.HasPrefix(poolOf, WarmPrefix) }

// unowned reports whether rec is a template's warm copy, which belongs to
// no project and is never stored.
func unowned(rec Record) bool { return rec.ProjectID == "" }
