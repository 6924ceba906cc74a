package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os/exec"
	"path/filepath"
	"regexp"
	"time"
)

// Templates' warm pools (issue 24, part 1): a create → first exec that
// takes a warm copy against a cold one, in the same run, through the HTTP
// API and through @lizard-build/sdk (bench/pool.mjs), and against raw
// runsc's create → first exec. The cold creates are a second project's,
// which has no pool: the same work, never a warm copy.

// setPool sets the bench project's pool of base at the default size and
// waits until it holds size copies.
func (s *server) setPool(size int) error {
	if err := s.call("PUT", "/api/template-pools/base", map[string]any{"size": size}, nil); err != nil {
		return err
	}
	return s.waitTemplatePool(size)
}

// waitTemplatePool waits until base's pool holds ready copies and none
// that go (no pool listed for 0).
func (s *server) waitTemplatePool(ready int) error {
	deadline := time.Now().Add(5 * time.Minute)
	for time.Now().Before(deadline) {
		var out struct {
			Pools []struct {
				Ready, Leaving int
			} `json:"pools"`
		}
		if err := s.call("GET", "/api/template-pools", nil, &out); err != nil {
			return err
		}
		if (ready == 0 && len(out.Pools) == 0) || (len(out.Pools) == 1 && out.Pools[0].Ready == ready && out.Pools[0].Leaving == 0) {
			return nil
		}
		time.Sleep(20 * time.Millisecond)
	}
	return fmt.Errorf("the pool of base did not hold %d copies in 5 minutes", ready)
}

// projectKey makes project name and an API key of it with the CLI, beside
// the running server.
func (s *server) projectKey(name string) (string, error) {
	cli := func(args ...string) ([]byte, error) {
		out, err := exec.Command(filepath.Join(s.dir, "lizard"), append(args, "--data-dir", s.dataDir)...).CombinedOutput()
		if err != nil {
			return nil, fmt.Errorf("lizard %v: %v: %s", args, err, out)
		}
		return out, nil
	}
	if _, err := cli("projects", "create", name); err != nil {
		return "", err
	}
	out, err := cli("keys", "create", "--project", name)
	if err != nil {
		return "", err
	}
	key := regexp.MustCompile(`(?m)^\S{20,}$`).Find(out)
	if key == nil {
		return "", fmt.Errorf("no key in %q", out)
	}
	return string(key), nil
}

// as is s called with another API key.
func (s *server) as(key string) *server {
	c := *s
	c.key = key
	return &c
}

// benchPool measures n creates → first exec from a full pool of base and
// n cold ones of a project without a pool, taking turns with the pool
// full and the host quiet before each; then raw runsc, then the same
// through the SDK.
func benchPool(ctx context.Context, s *server, raw *rawRunsc, n int) ([]result, error) {
	const size = 2
	coldKey, err := s.projectKey("bench-cold")
	if err != nil {
		return nil, err
	}
	if err := s.setPool(size); err != nil {
		return nil, err
	}
	var warm, cold []time.Duration
	for range n {
		for _, m := range []struct {
			s   *server
			out *[]time.Duration
		}{{s.as(coldKey), &cold}, {s, &warm}} {
			if err := s.waitTemplatePool(size); err != nil {
				return nil, err
			}
			d, err := timeit(1, m.s.createExecTrue)
			if err != nil {
				return nil, err
			}
			*m.out = append(*m.out, d...)
		}
	}
	if err := s.waitTemplatePool(size); err != nil {
		return nil, err
	}
	rawS, err := timeit(n, func() error {
		id, err := raw.start(ctx)
		if err != nil {
			return err
		}
		defer raw.destroy(id)
		return raw.exec(ctx, id, nil, "true")
	})
	if err != nil {
		return nil, err
	}
	out, err := runNode("pool.mjs", n, "LIZARD_API_URL="+s.url, "LIZARD_API_KEY="+s.key, "LIZARD_COLD_KEY="+coldKey)
	if err != nil {
		return nil, err
	}
	var sdk struct{ Warm, Cold []float64 }
	if err := json.Unmarshal(out, &sdk); err != nil || len(sdk.Warm) == 0 || len(sdk.Cold) == 0 {
		return nil, fmt.Errorf("bench/pool.mjs said %q: %v", out, err)
	}
	msd := func(v []float64) []time.Duration {
		var d []time.Duration
		for _, x := range v {
			d = append(d, time.Duration(x*float64(time.Millisecond)))
		}
		return d
	}
	if err := s.setPool(0); err != nil {
		return nil, err
	}
	return []result{
		{name: "create → first exec from a template pool vs a cold create", lizard: warm, floor: cold,
			note: "pool of base (2 copies, full before each); floor: the same create of a project without a pool, taking turns"},
		{name: "create → first exec from a template pool vs raw runsc", lizard: warm, floor: rawS},
		{name: "the same through @lizard-build/sdk vs a cold create", lizard: msd(sdk.Warm), floor: msd(sdk.Cold),
			note: "bench/pool.mjs: lizard.create('base') + process.exec('true'), the cold ones with the other project's key"},
	}, nil
}
