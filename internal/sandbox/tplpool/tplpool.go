// Package tplpool keeps templates' warm pools. A pool is a setting: a
// project, one of the templates it sees (a built-in one or its own), a
// sandbox size and a size N. Every node keeps N warm copies of that
// template booted for the project (sandbox.Service.Warm): a create of the
// project's with that template and size and no volume takes one instead of
// booting (the core's claim), and the pool refills in the background.
//
// Settings come from the store (the API's PUT /api/template-pools/{name},
// the CLI's lizard template pool), which every node reads again every
// Interval, and from the server's configuration (--template-pool), which
// the store's setting of the same pool replaces. Copies are of the
// template's current version: after a rebuild the old version's copies go
// and new ones are booted. Warm copies hold the node's capacity, not the
// project's quota, and yield to creates the node has no room for (the
// core drops one). A drained node keeps none (Hold), nor does a stopped
// server (Close).
package tplpool

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sort"
	"sync"
	"time"

	"github.com/lizard-build/lizard/internal/errdefs"
	"github.com/lizard-build/lizard/internal/sandbox"
	"github.com/lizard-build/lizard/internal/store"
	"github.com/lizard-build/lizard/internal/template"
)

// MaxSize bounds a pool's size (per node).
const MaxSize = 100

// DefaultInterval is how often the settings are read again.
const DefaultInterval = 5 * time.Second

// DefaultRefillDelay is how long after a create took a copy its pool
// waits to refill: a boot takes the CPU the new sandbox's first commands
// need.
const DefaultRefillDelay = 500 * time.Millisecond

// Core is what the pools need of the sandbox service.
type Core interface {
	// Warm boots a warm copy of project's template at size and returns
	// the key of its pool.
	Warm(ctx context.Context, projectID, tplName, size string) (string, error)
	// CurrentWarmKey is the key of the copies a create of project's
	// template at size takes now (the template's current version).
	CurrentWarmKey(projectID, tplName, size string) (string, error)
	Pooled(key string) int
	Pools() map[string]int
	TrimPool(ctx context.Context, key string, keep int)
	OnWarmClaimed(fn func(key string))
}

// Settings keeps the projects' pool settings (the store).
type Settings interface {
	SetTemplatePool(ctx context.Context, p store.TemplatePool) error
	TemplatePools(ctx context.Context) ([]store.TemplatePool, error)
}

// Config wires a Manager.
type Config struct {
	Core Core
	// Settings keeps what the API and the CLI set; nil: only Static.
	Settings Settings
	// Static are the server's configured pools (--template-pool), their
	// ProjectID and SandboxSize resolved.
	Static []store.TemplatePool
	// Interval is how often Settings are read again; 0: DefaultInterval.
	Interval time.Duration
	// RefillDelay is how long no copy is booted after a create took one;
	// 0: DefaultRefillDelay.
	RefillDelay time.Duration
	Logger      *slog.Logger
}

// Pool is one pool as the API shows it.
type Pool struct {
	Template    string `json:"template"`
	SandboxSize string `json:"sandboxSize"`
	// Size is how many warm copies each node keeps.
	Size int `json:"size"`
	// Ready is how many wait on this node, of the template's current
	// version.
	Ready int `json:"ready"`
	// Leaving is how many copies of the pool on this node go: of the
	// template's old version, or of a pool removed (listed with size 0
	// until they went).
	Leaving int `json:"leaving"`
	// Source is "project" (set through the API or the CLI) or "config"
	// (the server's --template-pool); "" for a pool removed.
	Source string `json:"source"`
}

// Sources of a pool's setting.
const (
	SourceProject = "project"
	SourceConfig  = "config"
)

// Manager keeps this node's template pools.
type Manager struct {
	cfg  Config
	log  *slog.Logger
	wake chan struct{}

	mu   sync.Mutex
	held bool
	// quietUntil: no copy is booted before (claimed).
	quietUntil time.Time
	last       []setting        // the settings last read (used when a read fails)
	failed     map[string]error // the last error of each pool's fill, logged once
	cancel     context.CancelFunc
	done       chan struct{}
	started    bool
}

// setting is one pool to keep.
type setting struct {
	store.TemplatePool
	source string
}

// New builds a Manager; Start runs it.
func New(cfg Config) *Manager {
	if cfg.Interval == 0 {
		cfg.Interval = DefaultInterval
	}
	if cfg.RefillDelay == 0 {
		cfg.RefillDelay = DefaultRefillDelay
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	m := &Manager{cfg: cfg, log: cfg.Logger, wake: make(chan struct{}, 1), failed: map[string]error{}, done: make(chan struct{})}
	cfg.Core.OnWarmClaimed(func(string) { m.claimed() })
	return m
}

// claimed holds the pools' refill for RefillDelay after a create took a
// copy, then nudges the loop.
func (m *Manager) claimed() {
	m.mu.Lock()
	m.quietUntil = time.Now().Add(m.cfg.RefillDelay)
	m.mu.Unlock()
	time.AfterFunc(m.cfg.RefillDelay, m.nudge)
}

// quiet reports whether a create took a copy within RefillDelay.
func (m *Manager) quiet() bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return time.Now().Before(m.quietUntil)
}

// Start keeps the pools in the background until Close.
func (m *Manager) Start() {
	ctx, cancel := context.WithCancel(context.Background())
	m.mu.Lock()
	m.cancel, m.started = cancel, true
	m.mu.Unlock()
	go m.run(ctx)
}

// Close stops keeping the pools and destroys this node's copies: a
// stopped server leaves no sandbox of no project running (one it could
// not destroy, killed with it, the next server removes as a stray).
func (m *Manager) Close() {
	m.mu.Lock()
	cancel, started := m.cancel, m.started
	m.mu.Unlock()
	if !started {
		return
	}
	cancel()
	<-m.done
	for key := range m.cfg.Core.Pools() {
		if sandbox.IsWarmKey(key) {
			m.cfg.Core.TrimPool(context.Background(), key, 0)
		}
	}
}

// Hold stops refilling for good (the node is drained; its copies go with
// its other warm copies).
func (m *Manager) Hold() {
	m.mu.Lock()
	m.held = true
	m.mu.Unlock()
}

func (m *Manager) nudge() {
	select {
	case m.wake <- struct{}{}:
	default:
	}
}

func (m *Manager) run(ctx context.Context) {
	defer close(m.done)
	t := time.NewTicker(m.cfg.Interval)
	defer t.Stop()
	for {
		m.reconcile(ctx)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-m.wake:
		}
	}
}

// Setting is project's pool of template tplName at sandboxSize ("" for the
// default size) with size copies per node, as it is stored: the size
// within 0 (no pool) to MaxSize, the sandbox size's name, a built-in
// template's real name for an alias. Whether the project has the template
// is its caller's to judge (the API's, the CLI's and the configuration's
// ways of knowing differ); a built-in one may have a pool before it is
// built, which fills once it is.
func Setting(projectID, tplName, sandboxSize string, size int) (store.TemplatePool, error) {
	if size < 0 || size > MaxSize {
		return store.TemplatePool{}, fmt.Errorf("size %d: a pool keeps 0 (no pool) to %d sandboxes per node: %w", size, MaxSize, errdefs.ErrInvalid)
	}
	if tplName == "" {
		return store.TemplatePool{}, fmt.Errorf("no template named: %w", errdefs.ErrInvalid)
	}
	sz, err := sandbox.LookupSize(sandboxSize)
	if err != nil {
		return store.TemplatePool{}, err
	}
	return store.TemplatePool{ProjectID: projectID, Template: template.Resolve(tplName), SandboxSize: sz.Name, Size: size}, nil
}

// Set records project's pool of template tplName at sandboxSize ("" for
// the default size): size warm copies per node, 0 for none.
func (m *Manager) Set(ctx context.Context, projectID, tplName, sandboxSize string, size int) (Pool, error) {
	if m.cfg.Settings == nil {
		return Pool{}, errdefs.WithCode("feature_unavailable", fmt.Errorf("template pools: this server's store keeps no pool settings: %w", errdefs.ErrUnavailable))
	}
	p, err := Setting(projectID, tplName, sandboxSize, size)
	if err != nil {
		return Pool{}, err
	}
	if !template.IsBuiltin(tplName) {
		if _, err := m.cfg.Core.CurrentWarmKey(projectID, tplName, p.SandboxSize); errors.Is(err, errdefs.ErrNotFound) {
			return Pool{}, errdefs.WithCode("template_not_found", fmt.Errorf("template %q: no such template: %w", tplName, errdefs.ErrNotFound))
		} else if err != nil {
			return Pool{}, err
		}
	}
	if err := m.cfg.Settings.SetTemplatePool(ctx, p); err != nil {
		return Pool{}, err
	}
	m.nudge()
	return m.pool(setting{TemplatePool: p, source: SourceProject}), nil
}

// List returns the pools of project, by template and sandbox size, with
// the pools removed whose copies have yet to go from this node.
func (m *Manager) List(ctx context.Context, projectID string) ([]Pool, error) {
	all, err := m.settings(ctx)
	if err != nil {
		return nil, err
	}
	type id struct{ template, size string }
	byID := map[id]*Pool{}
	var order []id
	for _, s := range all {
		if s.ProjectID == projectID {
			p := m.pool(s)
			byID[id{p.Template, p.SandboxSize}] = &p
			order = append(order, id{p.Template, p.SandboxSize})
		}
	}
	for key, n := range m.cfg.Core.Pools() {
		project, tpl, _, size, ok := sandbox.ParseWarmKey(key)
		if !ok || project != projectID {
			continue
		}
		p := byID[id{tpl, size}]
		if p == nil {
			p = &Pool{Template: tpl, SandboxSize: size}
			byID[id{tpl, size}] = p
			order = append(order, id{tpl, size})
		}
		if cur, err := m.cfg.Core.CurrentWarmKey(projectID, tpl, size); err != nil || cur != key || p.Source == "" {
			p.Leaving += n
		}
	}
	sort.Slice(order, func(i, j int) bool {
		if order[i].template != order[j].template {
			return order[i].template < order[j].template
		}
		return order[i].size < order[j].size
	})
	out := make([]Pool, 0, len(order))
	for _, k := range order {
		out = append(out, *byID[k])
	}
	return out, nil
}

// pool is setting s as listed, with its ready copies on this node.
func (m *Manager) pool(s setting) Pool {
	p := Pool{Template: s.Template, SandboxSize: s.SandboxSize, Size: s.Size, Source: s.source}
	if key, err := m.cfg.Core.CurrentWarmKey(s.ProjectID, s.Template, s.SandboxSize); err == nil {
		p.Ready = m.cfg.Core.Pooled(key)
	}
	return p
}

// settings are the pools to keep: Static, replaced by the store's setting
// of the same project, template and sandbox size (a size of 0 there is no
// row, so Static's comes back), sorted.
func (m *Manager) settings(ctx context.Context) ([]setting, error) {
	type id struct{ project, template, size string }
	byID := map[id]setting{}
	for _, p := range m.cfg.Static {
		byID[id{p.ProjectID, p.Template, p.SandboxSize}] = setting{TemplatePool: p, source: SourceConfig}
	}
	if m.cfg.Settings != nil {
		rows, err := m.cfg.Settings.TemplatePools(ctx)
		if err != nil {
			return nil, fmt.Errorf("template pools: read the settings: %w", err)
		}
		for _, p := range rows {
			byID[id{p.ProjectID, p.Template, p.SandboxSize}] = setting{TemplatePool: p, source: SourceProject}
		}
	}
	out := make([]setting, 0, len(byID))
	for _, s := range byID {
		if s.Size > 0 {
			out = append(out, s)
		}
	}
	sort.Slice(out, func(i, j int) bool {
		a, b := out[i], out[j]
		if a.ProjectID != b.ProjectID {
			return a.ProjectID < b.ProjectID
		}
		if a.Template != b.Template {
			return a.Template < b.Template
		}
		return a.SandboxSize < b.SandboxSize
	})
	return out, nil
}

// target is one pool to fill: its key now and how many it keeps.
type target struct {
	setting
	key string
}

// reconcile trims the copies no pool wants (a pool gone or shrunk, a
// template's old version) and boots the missing ones, one at a time
// across pools, until every pool is full or its boot failed.
func (m *Manager) reconcile(ctx context.Context) {
	all, err := m.settings(ctx)
	m.mu.Lock()
	if err != nil {
		m.log.Warn("template pools: settings unread; keeping the last ones", "err", err)
		all = m.last
	}
	m.last = all
	held := m.held
	m.mu.Unlock()
	var targets []target
	want := map[string]int{}
	for _, s := range all {
		if held {
			break
		}
		key, err := m.cfg.Core.CurrentWarmKey(s.ProjectID, s.Template, s.SandboxSize)
		switch {
		case errors.Is(err, errdefs.ErrNotFound) || errors.Is(err, errdefs.ErrUnavailable):
			// Not built yet, or being built (its progress in the
			// message): the pool fills once it is.
			m.log.Debug("template pool: template not built", "project", s.ProjectID, "template", s.Template, "err", err)
			continue
		case err != nil:
			m.note(s.ProjectID+"/"+s.Template+"/"+s.SandboxSize, err)
			continue
		}
		targets = append(targets, target{setting: s, key: key})
		want[key] = s.Size
	}
	for key, n := range m.cfg.Core.Pools() {
		if !sandbox.IsWarmKey(key) {
			continue
		}
		if keep, ok := want[key]; !ok || n > keep {
			// Not cut short by Close: a destroy stopped halfway leaks.
			m.cfg.Core.TrimPool(context.WithoutCancel(ctx), key, keep)
		}
	}
	failed := map[string]bool{}
	for progress := true; progress; {
		progress = false
		for _, t := range targets {
			if ctx.Err() != nil || m.isHeld() || m.quiet() {
				return // a quiet period ends with a nudge
			}
			if failed[t.key] || m.cfg.Core.Pooled(t.key) >= t.Size {
				continue
			}
			key, err := m.cfg.Core.Warm(ctx, t.ProjectID, t.Template, t.SandboxSize)
			if err != nil {
				failed[t.key] = true
				m.note(t.key, err)
				continue
			}
			m.note(t.key, nil)
			if key != t.key {
				// The template changed during the boot: that copy goes at
				// the next round, and this pool is filled then.
				failed[t.key] = true
				m.nudge()
				continue
			}
			progress = true
		}
	}
}

// note logs a pool's failure once, until it succeeds again.
func (m *Manager) note(key string, err error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	prev := m.failed[key]
	switch {
	case err == nil && prev != nil:
		delete(m.failed, key)
		m.log.Info("template pool: filling again", "pool", key)
	case err != nil && (prev == nil || prev.Error() != err.Error()):
		m.failed[key] = err
		m.log.Warn("template pool: warm copy not made; the pool stays short and is tried again", "pool", key, "err", err)
	}
}

func (m *Manager) isHeld() bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.held
}
