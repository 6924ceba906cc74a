// Package volume manages persistent volumes. Each is an ext4 filesystem in a
// sparse image file of its own under the data directory, so a volume full
// fails with ENOSPC inside the sandbox and nothing else on the host fills up.
//
// The filesystem is made at the largest size a volume may have, and a
// balloon file at its root, allocated but never written (so the image stays
// sparse), holds everything beyond the volume's size. Resizing is changing
// the balloon, online, in both directions: growing the filesystem itself
// would need CAP_SYS_RESOURCE (which a root in a container may lack) and
// quota support (which this kernel lacks). The sandbox sees only the data
// directory beside the balloon, bind-mounted at /workspace. A volume attached
// to a sandbox is loop-mounted on the host; it is attached to one sandbox at
// a time. The sandbox service and the API use it.
package volume

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/lizard-build/lizard/internal/disk"
	"github.com/lizard-build/lizard/internal/durable"
	"github.com/lizard-build/lizard/internal/errdefs"
	"github.com/lizard-build/lizard/internal/store"
)

// Volume is one persistent volume.
type Volume struct {
	ID         string    `json:"id"`
	ProjectID  string    `json:"projectId"`
	Name       string    `json:"name"`
	SizeGB     int       `json:"sizeGb"`
	Region     string    `json:"region,omitempty"`
	AttachedTo string    `json:"attachedTo,omitempty"`
	CreatedAt  time.Time `json:"createdAt"`
	// With an object store (Config.Images), a volume is synced there at
	// every detach. Version counts its attaches (its data may change
	// while attached); SyncedVersion is the Version last synced (0:
	// never) and SyncedAt when; a detached volume with SyncedVersion <
	// Version has a sync pending on its node. Stale says its node was lost
	// while it was attached: its data is as of SyncedAt, what was written
	// after is gone (until its next sync).
	Version       int        `json:"version,omitempty"`
	SyncedVersion int        `json:"syncedVersion,omitempty"`
	SyncedAt      *time.Time `json:"syncedAt,omitempty"`
	Stale         bool       `json:"stale,omitempty"`
	// Node is the cluster node that holds it ("" on a single server).
	Node string `json:"node,omitempty"`
	// Token admits requests to the volume's files (E2B's volume content
	// API, through internal/e2b); made with the volume, never listed by
	// the Lizard API.
	Token string `json:"token,omitempty"`
}

// Limits of the API.
const (
	DefaultSizeGB = 5
	MinSizeGB     = 1
)

// MountPath is where a sandbox sees its volume.
const MountPath = "/workspace"

// Config wires the manager.
type Config struct {
	Dir       string // images and mount points live here
	Store     store.Store
	MaxSizeGB int // largest volume; 0 means 50
	// Run runs a helper command (mkfs, mount, resize2fs …) and waits for
	// it; the server passes its reaper's, so statuses are not stolen.
	Run    func(*exec.Cmd) error
	Logger *slog.Logger
	// MaxProjectGB returns the most GB a project's volumes may add up to
	// (0: no limit); nil: no limit.
	MaxProjectGB func(ctx context.Context, projectID string) (int, error)
	// Disk refuses new volumes when the disk is low; nil: no check.
	Disk *disk.Guard
	// Images keeps volumes in the object store (durable.Images): a volume
	// is synced there at detach, and an attach on a node that does not
	// hold it fetches it. nil: a volume stays on its node's disk.
	Images Images
	// Shared is every node's volume records (the cluster's database;
	// Store is this node's view of it); nil on a single server. With
	// Images, an attach finds a volume of another node there and claims
	// it.
	Shared SharedStore
	// Gone reports whether a node was declared dead or removed: a volume
	// it held attached is taken at its last sync, stale. nil: none is.
	Gone func(ctx context.Context, node string) bool
	// Everywhere lists every node's volume records (cluster mode), so
	// that a project's volume quota counts its volumes on all nodes; nil:
	// this node's (Store). Two nodes creating at the same moment may
	// both pass: the sum is read, not locked, across nodes.
	Everywhere func(ctx context.Context) ([]store.Volume, error)
}

// Images is what the manager needs of the object store's durable images.
type Images interface {
	Upload(ctx context.Context, name, dir string) (durable.Manifest, error)
	Materialize(ctx context.Context, name, dir string) (durable.Manifest, error)
	Delete(ctx context.Context, name string) error
}

// SharedStore is the volume records of every node of a cluster.
// UpdateVolume keeps the record's node unless v.Node names another.
type SharedStore interface {
	Volumes(ctx context.Context) ([]store.Volume, error)
	UpdateVolume(ctx context.Context, v store.Volume) error
}

// ImageName is the name of volume id's image in the object store: one
// file, imageFile, the volume's filesystem image, in content-addressed
// chunks (only the chunks a sync changed are uploaded).
func ImageName(id string) string { return "volumes/" + id }

const imageFile = "volume.img"

// Manager creates, attaches and resizes volumes. It is safe for concurrent
// use.
type Manager struct {
	cfg Config
	mu  sync.Mutex // serializes every change: they are rare and slow
	// syncs is the background syncs to the object store, by volume
	// (guarded by mu); bg is their context, canceled by Close, wg waits
	// for them.
	syncs map[string]*syncJob
	// lent is the volumes lent to Lend's callers (guarded by mu).
	lent   map[string]*lending
	bg     context.Context
	stopBg context.CancelFunc
	wg     sync.WaitGroup
}

// New prepares the volume directory.
func New(cfg Config) (*Manager, error) {
	if cfg.MaxSizeGB == 0 {
		cfg.MaxSizeGB = 50
	}
	if cfg.Run == nil {
		cfg.Run = func(c *exec.Cmd) error { return c.Run() }
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if err := os.MkdirAll(cfg.Dir, 0o700); err != nil {
		return nil, err
	}
	bg, stop := context.WithCancel(context.Background())
	return &Manager{cfg: cfg, syncs: map[string]*syncJob{}, lent: map[string]*lending{}, bg: bg, stopBg: stop}, nil
}

// Close cancels the background syncs and waits for them to stop; a volume
// left unsynced is synced by Reconcile at the next start (its data is on
// this node's disk).
func (m *Manager) Close() {
	m.stopBg()
	m.wg.Wait()
}

var nameRE = regexp.MustCompile(`^[a-z0-9]([a-z0-9-]{0,62}[a-z0-9])?$`)

func (m *Manager) image(id string) string { return filepath.Join(m.cfg.Dir, id+".img") }

// mountDir is where volume id's filesystem is mounted on the host.
func (m *Manager) mountDir(id string) string { return filepath.Join(m.cfg.Dir, id) }

// DataDir is the directory a sandbox sees at MountPath.
func (m *Manager) DataDir(id string) string { return filepath.Join(m.mountDir(id), "data") }

func (m *Manager) balloon(id string) string { return filepath.Join(m.mountDir(id), ".balloon") }

func (m *Manager) checkSize(gb int) error {
	if gb < MinSizeGB || gb > m.cfg.MaxSizeGB {
		return errdefs.WithCode("invalid_volume_size", fmt.Errorf("sizeGb %d: must be %d to %d: %w", gb, MinSizeGB, m.cfg.MaxSizeGB, errdefs.ErrInvalid))
	}
	return nil
}

func notFound(ref string) error {
	return errdefs.WithCode("volume_not_found", fmt.Errorf("volume %q: %w", ref, errdefs.ErrNotFound))
}

// Create makes a volume. With getOrCreate an existing volume of that name
// is returned as it is (its size unchanged); without, it is a conflict.
func (m *Manager) Create(ctx context.Context, projectID, name string, sizeGB int, region string, getOrCreate bool) (Volume, error) {
	if !nameRE.MatchString(name) {
		return Volume{}, errdefs.WithCode("invalid_volume_name", fmt.Errorf("name %q: lowercase letters, digits and dashes, starting and ending with a letter or digit, at most 64: %w", name, errdefs.ErrInvalid))
	}
	if sizeGB == 0 {
		sizeGB = DefaultSizeGB
	}
	if err := m.checkSize(sizeGB); err != nil {
		return Volume{}, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if v, err := m.findLocked(ctx, projectID, name); err == nil {
		if getOrCreate {
			return v, nil
		}
		return Volume{}, errdefs.WithCode("volume_exists", fmt.Errorf("volume %q exists: %w", name, errdefs.ErrConflict))
	}
	if err := m.cfg.Disk.Check(); err != nil {
		return Volume{}, err
	}
	if err := m.checkQuotaLocked(ctx, projectID, "", sizeGB); err != nil {
		return Volume{}, err
	}
	v := Volume{ID: store.NewID("vol_", 16), ProjectID: projectID, Name: name, SizeGB: sizeGB, Region: region, CreatedAt: time.Now().UTC(), Token: newToken()}
	img := m.image(v.ID)
	fail := func(err error) (Volume, error) {
		m.unmount(ctx, v.ID)
		os.Remove(m.mountDir(v.ID))
		os.Remove(img)
		return Volume{}, err
	}
	if err := m.initLocked(ctx, v.ID, sizeGB); err != nil {
		return fail(err)
	}
	if err := m.insertLocked(ctx, v); err != nil {
		return fail(err)
	}
	m.cfg.Logger.Info("volume created", "volume", v.ID, "name", name, "sizeGb", sizeGB)
	return v, nil
}

// initLocked makes volume id's image: an empty filesystem offering
// sizeGB, its data directory owned by the sandbox's default user (uid
// 1000; root may write anyway), left unmounted.
func (m *Manager) initLocked(ctx context.Context, id string, sizeGB int) error {
	if err := m.makeImage(ctx, m.image(id)); err != nil {
		return err
	}
	if err := m.mountLocked(ctx, id); err != nil {
		return err
	}
	if err := os.Mkdir(m.DataDir(id), 0o755); err != nil {
		return err
	}
	if err := os.Chown(m.DataDir(id), 1000, 1000); err != nil {
		return err
	}
	if err := m.setSize(id, sizeGB); err != nil {
		return err
	}
	return m.unmount(ctx, id)
}

// makeImage writes a sparse file of the largest volume size and an ext4
// filesystem in it.
func (m *Manager) makeImage(ctx context.Context, img string) error {
	f, err := os.OpenFile(img, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	err = f.Truncate(int64(m.cfg.MaxSizeGB) << 30)
	f.Close()
	if err != nil {
		return err
	}
	return m.run(ctx, "mkfs.ext4", "-q", "-F", "-m", "0", "-E", "lazy_itable_init=1,lazy_journal_init=1", img)
}

// setSize makes the mounted volume id offer sizeGB: the balloon takes the
// rest of the filesystem. Shrinking the balloon frees blocks at once;
// growing it fails with ENOSPC when the data does not leave room, and then
// nothing changes.
func (m *Manager) setSize(id string, sizeGB int) error {
	var st unix.Statfs_t
	if err := unix.Statfs(m.mountDir(id), &st); err != nil {
		return err
	}
	f, err := os.OpenFile(m.balloon(id), os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return err
	}
	// What is free now plus what the balloon holds, minus the size wanted.
	avail := int64(st.Bavail)*int64(st.Bsize) + fi.Size()
	want := max(avail-int64(sizeGB)<<30, 0)
	if want <= fi.Size() {
		return f.Truncate(want)
	}
	if err := unix.Fallocate(int(f.Fd()), 0, 0, want); err != nil {
		if errors.Is(err, unix.ENOSPC) {
			return errdefs.WithCode("volume_too_full_to_shrink", fmt.Errorf("the data leaves no room to shrink to %d GB: %w", sizeGB, errdefs.ErrConflict))
		}
		return err
	}
	return nil
}

func (m *Manager) run(ctx context.Context, name string, args ...string) error {
	cmd := exec.CommandContext(ctx, name, args...)
	var out strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := m.cfg.Run(cmd); err != nil {
		// The output names host paths: for the log only.
		return errdefs.WithCause(errdefs.ErrUnavailable, name+" failed (its output is in the server log)", fmt.Errorf("%v: %s", err, strings.TrimSpace(out.String())))
	}
	return nil
}

// Get finds a volume of the project by name or id.
func (m *Manager) Get(ctx context.Context, projectID, ref string) (Volume, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	v, _, err := m.findAnyLocked(ctx, projectID, ref)
	return v, err
}

// List returns the project's volumes, oldest first.
func (m *Manager) List(ctx context.Context, projectID string) ([]Volume, error) {
	all, err := m.all(ctx)
	if err != nil {
		return nil, err
	}
	out := []Volume{}
	for _, v := range all {
		if v.ProjectID == projectID {
			out = append(out, v)
		}
	}
	return out, nil
}

func (m *Manager) all(ctx context.Context) ([]Volume, error) {
	recs, err := m.cfg.Store.Volumes(ctx)
	if err != nil {
		return nil, err
	}
	return decodeVolumes(recs)
}

// quotaVolumes is the volumes a project's quota counts: every node's
// (Everywhere) or this node's.
func (m *Manager) quotaVolumes(ctx context.Context) ([]Volume, error) {
	if m.cfg.Everywhere == nil {
		return m.all(ctx)
	}
	recs, err := m.cfg.Everywhere(ctx)
	if err != nil {
		return nil, err
	}
	return decodeVolumes(recs)
}

// decodeVolumes is the volumes of records, oldest first.
func decodeVolumes(recs []store.Volume) ([]Volume, error) {
	out := make([]Volume, 0, len(recs))
	for _, r := range recs {
		var v Volume
		if err := json.Unmarshal(r.Spec, &v); err != nil {
			return nil, fmt.Errorf("volume %s: %w", r.ID, err)
		}
		v.Node = r.Node
		out = append(out, v)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].CreatedAt.Before(out[j].CreatedAt) })
	return out, nil
}

func (m *Manager) findLocked(ctx context.Context, projectID, ref string) (Volume, error) {
	all, err := m.all(ctx)
	if err != nil {
		return Volume{}, err
	}
	for _, v := range all {
		if v.ProjectID == projectID && (v.ID == ref || v.Name == ref) {
			return v, nil
		}
	}
	return Volume{}, notFound(ref)
}

// checkQuotaLocked refuses sizeGB for volume id (new: "") when the sizes
// of the project's volumes would add up to more than its limit. m.mu
// is held, so no other change slips in between the sum and the change.
func (m *Manager) checkQuotaLocked(ctx context.Context, projectID, id string, sizeGB int) error {
	if m.cfg.MaxProjectGB == nil {
		return nil
	}
	limit, err := m.cfg.MaxProjectGB(ctx, projectID)
	if err != nil || limit <= 0 {
		return err
	}
	all, err := m.quotaVolumes(ctx)
	if err != nil {
		return err
	}
	used := 0
	for _, v := range all {
		if v.ProjectID == projectID && v.ID != id {
			used += v.SizeGB
		}
	}
	if used+sizeGB > limit {
		return store.LimitVolumeGB.Exceeded(float64(used), float64(limit), float64(sizeGB))
	}
	return nil
}

func (m *Manager) insertLocked(ctx context.Context, v Volume) error {
	spec, err := json.Marshal(v)
	if err != nil {
		return err
	}
	return m.cfg.Store.InsertVolume(ctx, store.Volume{ID: v.ID, ProjectID: v.ProjectID, Name: v.Name, Spec: spec, CreatedAt: v.CreatedAt})
}

func (m *Manager) saveLocked(ctx context.Context, v Volume) error {
	spec, err := json.Marshal(v)
	if err != nil {
		return err
	}
	return m.cfg.Store.UpdateVolume(ctx, store.Volume{ID: v.ID, Spec: spec})
}

// Delete removes a detached volume and its data. An attached one is a
// conflict naming its sandbox.
func (m *Manager) Delete(ctx context.Context, projectID, ref string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	v, _, err := m.findAnyLocked(ctx, projectID, ref)
	if err == nil && m.lent[v.ID] != nil {
		if err = m.waitLentLocked(ctx, v.ID); err == nil {
			v, _, err = m.findAnyLocked(ctx, projectID, ref)
		}
	}
	if err != nil {
		return err
	}
	if v.AttachedTo != "" {
		return errdefs.WithCode("volume_attached", fmt.Errorf("volume %q is attached to sandbox %s: %w", v.Name, v.AttachedTo, errdefs.ErrConflict))
	}
	m.quiesceLocked(v.ID)
	m.unmount(ctx, v.ID)
	if err := m.cfg.Store.DeleteVolume(ctx, v.ID); err != nil {
		return err
	}
	m.deleteImage(ctx, v.ID)
	os.Remove(m.mountDir(v.ID))
	m.cfg.Logger.Info("volume deleted", "volume", v.ID)
	if err := os.Remove(m.image(v.ID)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return nil
}

// Attach gives the volume to sandboxID and mounts it on the host; it
// returns the directory to bind-mount at MountPath. A volume attached to
// another sandbox is a conflict naming it.
func (m *Manager) Attach(ctx context.Context, projectID, ref, sandboxID string) (Volume, string, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	v, local, err := m.findAnyLocked(ctx, projectID, ref)
	for err == nil && !local && m.pendingElsewhere(ctx, v) {
		// Its freshest data is still on the node that holds it: wait
		// for that node's sync (placement sends creates there, so this is
		// a move or a race).
		m.mu.Unlock()
		err = m.waitSynced(ctx, v)
		m.mu.Lock()
		if err == nil {
			v, local, err = m.findAnyLocked(ctx, projectID, ref)
		}
	}
	if err == nil && local && m.lent[v.ID] != nil {
		// Its files are being read or written through Lend: the sandbox
		// gets it once that is over.
		if err = m.waitLentLocked(ctx, v.ID); err == nil {
			v, local, err = m.findAnyLocked(ctx, projectID, ref)
		}
	}
	if err != nil {
		return Volume{}, "", err
	}
	if local {
		m.quiesceLocked(v.ID) // a sync since its last detach here stops
	}
	if !local && v.AttachedTo != "" && m.cfg.Gone != nil && m.cfg.Gone(ctx, v.Node) {
		m.cfg.Logger.Warn("volume lost with its node; it is taken at its last sync", "volume", v.ID, "node", v.Node, "sandbox", v.AttachedTo)
		v.AttachedTo, v.Stale = "", true
	}
	if v.AttachedTo != "" && v.AttachedTo != sandboxID {
		return Volume{}, "", errdefs.WithCode("volume_in_use", fmt.Errorf("volume %q is attached to sandbox %s: %w", v.Name, v.AttachedTo, errdefs.ErrConflict))
	}
	if !local {
		// Another node's: fetched from its last sync, claimed below.
		if err := m.fetchLocked(ctx, &v); err != nil {
			return Volume{}, "", err
		}
	}
	if err := m.mountLocked(ctx, v.ID); err != nil {
		return Volume{}, "", err
	}
	if (v.AttachedTo != sandboxID || !local) && m.cfg.Images != nil {
		v.Version++ // counted for the syncs only
	}
	v.AttachedTo = sandboxID
	if err := m.saveLocked(ctx, v); err != nil {
		m.unmount(ctx, v.ID)
		return Volume{}, "", err
	}
	return v, m.DataDir(v.ID), nil
}

// Mount makes sure volume id is mounted on the host (after a reboot, for a
// paused sandbox that still holds it).
func (m *Manager) Mount(ctx context.Context, id string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.quiesceLocked(id) // a Release's sync, if the move failed
	if err := m.mountLocked(ctx, id); err != nil {
		return err
	}
	if m.cfg.Images == nil {
		return nil
	}
	all, err := m.all(ctx)
	if err != nil {
		return err
	}
	for _, v := range all {
		if v.ID == id && v.AttachedTo != "" && v.SyncedVersion >= v.Version {
			v.Version++ // it may change again: synced at its detach
			return m.saveLocked(ctx, v)
		}
	}
	return nil
}

func (m *Manager) mountLocked(ctx context.Context, id string) error {
	dir := m.mountDir(id)
	if mounted(dir) {
		return nil
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	// A crash may have left the filesystem unclean: check it first.
	m.run(ctx, "e2fsck", "-p", m.image(id))
	return m.run(ctx, "mount", "-t", "ext4", "-o", "loop,nodev,nosuid", m.image(id), dir)
}

func (m *Manager) unmount(ctx context.Context, id string) error {
	dir := m.mountDir(id)
	if !mounted(dir) {
		return nil
	}
	// A sandbox's gofer keeps the filesystem mounted in a namespace of its
	// own until it has exited, which a killed one may not have yet: the
	// umount here then only detaches it, and what the sandbox wrote last
	// may still be in the page cache, not in the image a sync reads (a
	// moved volume had a file of zeros). syncfs writes it out first.
	if f, err := os.Open(dir); err == nil {
		err = unix.Syncfs(int(f.Fd()))
		f.Close()
		if err != nil {
			return fmt.Errorf("flush volume %s: %w", id, err)
		}
	}
	// The loop device goes with it: mount set it up to clear itself.
	return m.run(ctx, "umount", dir)
}

// Detach takes every volume attached to sandboxID back, unmounted. Data
// stays. Detaching a sandbox with no volume is a no-op.
func (m *Manager) Detach(ctx context.Context, sandboxID string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	all, err := m.all(ctx)
	if err != nil {
		return err
	}
	var errs []error
	for _, v := range all {
		if v.AttachedTo != sandboxID {
			continue
		}
		if err := m.unmount(ctx, v.ID); err != nil {
			errs = append(errs, err)
			continue
		}
		v.AttachedTo = ""
		if err := m.saveLocked(ctx, v); err != nil {
			errs = append(errs, err)
			continue
		}
		m.cfg.Logger.Info("volume detached", "volume", v.ID, "sandbox", sandboxID)
		m.startSyncLocked(v)
	}
	errs = append(errs, m.detachReleasedLocked(ctx, sandboxID, all))
	m.pruneLocked(ctx)
	return errors.Join(errs...)
}

// Reconcile detaches volumes whose sandbox is gone (live says which exist)
// and unmounts volumes nobody holds; run at start.
func (m *Manager) Reconcile(ctx context.Context, live func(sandboxID string) bool) error {
	all, err := m.all(ctx)
	if err != nil {
		return err
	}
	var errs []error
	for _, v := range all {
		switch {
		case v.AttachedTo != "" && !live(v.AttachedTo):
			errs = append(errs, m.Detach(ctx, v.AttachedTo))
		case v.AttachedTo == "":
			m.mu.Lock()
			err := m.unmount(ctx, v.ID)
			if errs = append(errs, err); err == nil {
				m.startSyncLocked(v) // one the last run did not finish
			}
			m.mu.Unlock()
		}
	}
	m.mu.Lock()
	m.pruneLocked(ctx)
	m.mu.Unlock()
	return errors.Join(errs...)
}

// Resize changes a volume's size, online: a sandbox holding it sees the new
// free space at once. Shrinking needs at least 10% of the new size free.
func (m *Manager) Resize(ctx context.Context, projectID, ref string, sizeGB int) (Volume, error) {
	if err := m.checkSize(sizeGB); err != nil {
		return Volume{}, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	v, err := m.findLocked(ctx, projectID, ref)
	if err == nil && m.lent[v.ID] != nil {
		if err = m.waitLentLocked(ctx, v.ID); err == nil {
			v, err = m.findLocked(ctx, projectID, ref)
		}
	}
	if err != nil {
		return Volume{}, err
	}
	if sizeGB == v.SizeGB {
		return v, nil
	}
	if err := m.checkQuotaLocked(ctx, projectID, v.ID, sizeGB); err != nil {
		return Volume{}, err
	}
	if v.AttachedTo == "" {
		// Its image changes: a sync in progress stops, and one starts
		// once it is unmounted again.
		m.quiesceLocked(v.ID)
		defer func() {
			if m.unmount(ctx, v.ID) == nil {
				m.startSyncLocked(v)
			}
		}()
	}
	if err := m.mountLocked(ctx, v.ID); err != nil {
		return Volume{}, err
	}
	if sizeGB < v.SizeGB {
		used, err := m.dataBytes(v.ID)
		if err != nil {
			return Volume{}, err
		}
		if used > (int64(sizeGB)<<30)*9/10 {
			return Volume{}, errdefs.WithCode("volume_too_full_to_shrink", fmt.Errorf("volume %q holds %d MiB; %d GB would leave less than 10%% free: %w", v.Name, used>>20, sizeGB, errdefs.ErrConflict))
		}
	}
	if err := m.setSize(v.ID, sizeGB); err != nil {
		return Volume{}, err
	}
	next := v
	next.SizeGB = sizeGB
	if v.AttachedTo == "" && m.cfg.Images != nil {
		next.Version++ // changed while detached: synced again
	}
	if err := m.saveLocked(ctx, next); err != nil {
		return Volume{}, err
	}
	v = next
	m.cfg.Logger.Info("volume resized", "volume", v.ID, "sizeGb", sizeGB)
	return v, nil
}

// dataBytes is what the volume's data occupies: the filesystem's used
// blocks minus the balloon's.
func (m *Manager) dataBytes(id string) (int64, error) {
	var st unix.Statfs_t
	if err := unix.Statfs(m.mountDir(id), &st); err != nil {
		return 0, err
	}
	var bst unix.Stat_t
	if err := unix.Stat(m.balloon(id), &bst); err != nil {
		return 0, err
	}
	used := (int64(st.Blocks) - int64(st.Bfree)) * int64(st.Bsize)
	return max(used-bst.Blocks*512, 0), nil
}

// mounted says whether dir is a mount point.
func mounted(dir string) bool {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return false
	}
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) > 4 && f[4] == dir {
			return true
		}
	}
	return false
}
