package tmpldist

import (
	"encoding/json"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"
)

// cache is the index of the template versions this node fetched from the
// object store (not those it built): their sizes and when a create last
// used them, kept in a file so that it outlives a restart. Versions are
// evicted least recently used first once the total passes the limit.
type cache struct {
	path  string // the index file
	limit int64  // bytes; 0: no limit

	mu      sync.Mutex
	entries map[string]*cacheEntry // by version directory
}

// cacheEntry is one fetched version.
type cacheEntry struct {
	Project  string    `json:"project,omitempty"` // "" for a built-in template
	Name     string    `json:"name"`
	Dir      string    `json:"dir"` // the version's directory
	Size     int64     `json:"size"`
	LastUsed time.Time `json:"lastUsed"`
}

// openCache reads the index at path (none: an empty cache); entries whose
// directory is gone are dropped.
func openCache(path string, limit int64) (*cache, error) {
	c := &cache{path: path, limit: limit, entries: map[string]*cacheEntry{}}
	b, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return c, nil
	}
	if err != nil {
		return nil, err
	}
	var list []*cacheEntry
	if err := json.Unmarshal(b, &list); err != nil {
		return c, nil // unreadable: start over (the versions stay, as built ones)
	}
	for _, e := range list {
		if _, err := os.Stat(e.Dir); err == nil {
			c.entries[e.Dir] = e
		}
	}
	return c, nil
}

// saveLocked writes the index (a new file renamed over the old one).
func (c *cache) saveLocked() error {
	list := make([]*cacheEntry, 0, len(c.entries))
	for _, e := range c.entries {
		list = append(list, e)
	}
	slices.SortFunc(list, func(a, b *cacheEntry) int { return a.LastUsed.Compare(b.LastUsed) })
	b, err := json.Marshal(list)
	if err != nil {
		return err
	}
	tmp := c.path + ".tmp"
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, c.path)
}

// has reports whether dir is a fetched version.
func (c *cache) has(dir string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	_, ok := c.entries[dir]
	return ok
}

// add records a fetched version, used now.
func (c *cache) add(e cacheEntry) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.entries[e.Dir] = &e
	return c.saveLocked()
}

// touch records that a create used dir now (nothing when it was not
// fetched). The index is written at most once a minute per entry.
func (c *cache) touch(dir string, now time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	e, ok := c.entries[dir]
	if !ok {
		return
	}
	save := now.Sub(e.LastUsed) > time.Minute
	e.LastUsed = now
	if save {
		c.saveLocked()
	}
}

// total is the size of every fetched version.
func (c *cache) total() int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	var n int64
	for _, e := range c.entries {
		n += e.Size
	}
	return n
}

// evict removes fetched versions, least recently used first, until the
// total is within the limit: evict (the registry's) says whether it
// removed one (false: in use, or being built; it stays). keep is never
// evicted (the version a create is about to use). It returns the entries
// evicted.
func (c *cache) evict(keep string, evict func(e cacheEntry) (bool, error)) ([]cacheEntry, error) {
	if c.limit <= 0 {
		return nil, nil
	}
	c.mu.Lock()
	var total int64
	lru := make([]cacheEntry, 0, len(c.entries))
	for dir, e := range c.entries {
		if _, err := os.Stat(dir); err != nil {
			delete(c.entries, dir) // pruned as an old version meanwhile
			continue
		}
		total += e.Size
		lru = append(lru, *e)
	}
	c.saveLocked()
	c.mu.Unlock()
	slices.SortFunc(lru, func(a, b cacheEntry) int { return a.LastUsed.Compare(b.LastUsed) })
	var out []cacheEntry
	var errs []error
	for _, e := range lru {
		if total <= c.limit {
			break
		}
		if e.Dir == keep {
			continue
		}
		ok, err := evict(e)
		if err != nil {
			errs = append(errs, err)
		}
		if !ok {
			continue
		}
		total -= e.Size
		out = append(out, e)
		c.mu.Lock()
		delete(c.entries, e.Dir)
		c.saveLocked()
		c.mu.Unlock()
	}
	return out, errors.Join(errs...)
}

// dirOf is the version directory of a template's rootfs.
func dirOf(rootfs string) string { return filepath.Dir(rootfs) }
