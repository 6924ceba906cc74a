package main

import (
	"context"
	"encoding/json"
	"fmt"
	"time"
)

// Templates' warm pools (issue 24, part 1): a create → first exec that
// takes a warm copy against a cold one, in the same run, through the HTTP
// API and through @lizard-build/sdk (bench/pool.mjs), and against raw
// runsc's create → first exec.

// setPool sets the bench project's pool of base at the default size and
// waits until it holds size copies.
func (s *server) setPool(size int) error {
	if err := s.call("PUT", "/api/template-pools/base", map[string]any{"size": size}, nil); err != nil {
		return err
	}
	return s.waitTemplatePool(size)
}

// waitTemplatePool waits until base's pool holds ready copies (no pool
// listed for 0).
func (s *server) waitTemplatePool(ready int) error {
	deadline := time.Now().Add(5 * time.Minute)
	for time.Now().Before(deadline) {
		var out struct {
			Pools []struct {
				Ready int `json:"ready"`
			} `json:"pools"`
		}
		if err := s.call("GET", "/api/template-pools", nil, &out); err != nil {
			return err
		}
		if (ready == 0 && len(out.Pools) == 0) || (len(out.Pools) == 1 && out.Pools[0].Ready == ready) {
			return nil
		}
		time.Sleep(20 * time.Millisecond)
	}
	return fmt.Errorf("the pool of base did not hold %d copies in 5 minutes", ready)
}

// benchPool measures n creates → first exec from a full pool of base
// (the pool refilled before each), n cold ones in the same run, and the
// same through the SDK.
func benchPool(ctx context.Context, s *server, raw *rawRunsc, n int) ([]result, error) {
	const size = 2
	cold := func() error {
		id, err := s.create()
		if err != nil {
			return err
		}
		defer s.kill(id)
		return s.execTrue(id)
	}
	var warm, coldS []time.Duration
	if err := s.setPool(size); err != nil {
		return nil, err
	}
	for range n {
		// One warm, one cold (the pool emptied for it), taking turns.
		if err := s.waitTemplatePool(size); err != nil {
			return nil, err
		}
		d, err := timeit(1, cold) // takes a copy: the pool is full
		if err != nil {
			return nil, err
		}
		warm = append(warm, d...)
		if err := s.setPool(0); err != nil {
			return nil, err
		}
		if d, err = timeit(1, cold); err != nil {
			return nil, err
		}
		coldS = append(coldS, d...)
		if err := s.call("PUT", "/api/template-pools/base", map[string]any{"size": size}, nil); err != nil {
			return nil, err
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
	out, err := runNode("pool.mjs", n, "LIZARD_API_URL="+s.url, "LIZARD_API_KEY="+s.key)
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
		{name: "create → first exec from a template pool vs a cold create", lizard: warm, floor: coldS,
			note: "pool of base (2 copies, refilled before each); floor: the same create with the pool emptied, taking turns"},
		{name: "create → first exec from a template pool vs raw runsc", lizard: warm, floor: rawS},
		{name: "the same through @lizard-build/sdk vs a cold create", lizard: msd(sdk.Warm), floor: msd(sdk.Cold),
			note: "bench/pool.mjs: lizard.create('base') + process.exec('true')"},
	}, nil
}
