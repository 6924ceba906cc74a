package main

import (
	"context"
	"fmt"
	"io"
	"sort"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/lizard-build/lizard/internal/cgroup"
	"github.com/lizard-build/lizard/internal/runtime/gvisor"
)

// densityIdle is how long a sandbox idles before its memory is read: what
// its start touched has settled (the agent's garbage collected).
const densityIdle = 5 * time.Second

// memSample is one idle sandbox's memory: its cgroup's charge and the
// parts memory.stat names.
type memSample struct {
	total int64
	cgroup.MemoryParts
}

// benchDensity measures what an idle sandbox costs the host in memory: n
// base sandboxes of lizard (agent up, nothing run) against n raw runsc
// containers of the same rootfs running sleep (the floor: the sentry and
// gofer with one process), each read from its cgroup after densityIdle.
// It also lists the processes inside a lizard sandbox with their resident
// memory as the sandbox's kernel sees it: what of the difference is ours.
func benchDensity(ctx context.Context, w io.Writer, s *server, raw *rawRunsc, n int) error {
	var ids []string
	defer func() {
		for _, id := range ids {
			s.kill(id)
		}
	}()
	for range n {
		id, err := s.create()
		if err != nil {
			return err
		}
		ids = append(ids, id)
	}
	var rids []string
	defer func() {
		for _, id := range rids {
			raw.destroy(id)
		}
	}()
	for range n {
		id, err := raw.start(ctx)
		if err != nil {
			return err
		}
		rids = append(rids, id)
	}
	select {
	case <-time.After(densityIdle):
	case <-ctx.Done():
		return ctx.Err()
	}
	var lz, floor []memSample
	for _, id := range ids {
		m, err := readMem("/" + gvisor.DefaultCgroupParent + "/" + id)
		if err != nil {
			return fmt.Errorf("sandbox %s: %w", id, err)
		}
		lz = append(lz, m)
	}
	for _, id := range rids {
		m, err := readMem("/lizard-bench/" + id)
		if err != nil {
			return fmt.Errorf("raw container %s: %w", id, err)
		}
		floor = append(floor, m)
	}
	procs, err := s.processRSS(ids[0])
	if err != nil {
		return err
	}

	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(tw, "idle sandbox memory (n=%d, %s idle)\tlizard min\tp50\tp95\trunsc min\tp50\tp95\tratio p50\t\n", n, densityIdle)
	row := func(name string, f func(memSample) int64) {
		l, r := stats(each(lz, f)), stats(each(floor, f))
		ratio := "-"
		if r[1] > 0 {
			ratio = fmt.Sprintf("%.2fx", float64(l[1])/float64(r[1]))
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t\n", name, mib(l[0]), mib(l[1]), mib(l[2]), mib(r[0]), mib(r[1]), mib(r[2]), ratio)
	}
	row("cgroup charge", func(m memSample) int64 { return m.total })
	row("  anonymous", func(m memSample) int64 { return m.Anon })
	row("  file and shared (the sentry's memory file)", func(m memSample) int64 { return m.File })
	tw.Flush()
	fmt.Fprintf(w, "processes in an idle lizard sandbox (resident, as the sandbox sees it): %s\n", procs)
	fmt.Fprintln(w, "lizard: an API create of the base template, agent up, nothing run; runsc: the same rootfs running sleep, without a network")
	return nil
}

// each is f of every sample.
func each(ms []memSample, f func(memSample) int64) []int64 {
	v := make([]int64, 0, len(ms))
	for _, m := range ms {
		v = append(v, f(m))
	}
	return v
}

func mib(b int64) string { return fmt.Sprintf("%.1fMiB", float64(b)/(1<<20)) }

// readMem reads the memory charged to the cgroup at path, and its parts.
func readMem(path string) (memSample, error) {
	u, err := cgroup.Read(cgroup.Root, path)
	if err != nil {
		return memSample{}, err
	}
	parts, err := cgroup.ReadMemoryParts(cgroup.Root, path)
	return memSample{total: u.MemoryBytes, MemoryParts: parts}, err
}

// processRSS lists sandbox id's processes with their resident memory,
// largest first, read from its /proc through the agent.
func (s *server) processRSS(id string) (string, error) {
	const script = `me=$$
for p in /proc/[0-9]*; do
  [ "${p#/proc/}" = "$me" ] && continue
  st=$(cat "$p/status" 2>/dev/null) || continue
  [ "$(echo "$st" | sed -n 's/^PPid:[[:space:]]*//p')" = "$me" ] && continue
  rss=$(echo "$st" | sed -n 's/^VmRSS:[[:space:]]*\([0-9]*\) kB/\1/p')
  cmd=$(tr '\0' ' ' < "$p/cmdline" 2>/dev/null | cut -c1-40)
  [ -n "$rss" ] && echo "$rss $cmd"
done`
	stdout, err := s.output(id, map[string]any{"cmd": []string{"sh", "-c", script}})
	if err != nil {
		return "", fmt.Errorf("list processes: %w", err)
	}
	type proc struct {
		kb  int64
		cmd string
	}
	var ps []proc
	for _, line := range strings.Split(strings.TrimSpace(stdout), "\n") {
		kb, cmd, _ := strings.Cut(line, " ")
		n, err := strconv.ParseInt(kb, 10, 64)
		if err != nil {
			continue
		}
		ps = append(ps, proc{n, strings.TrimSpace(cmd)})
	}
	sort.Slice(ps, func(i, j int) bool { return ps[i].kb > ps[j].kb })
	var parts []string
	for _, p := range ps {
		parts = append(parts, fmt.Sprintf("%s %s", p.cmd, mib(p.kb<<10)))
	}
	return strings.Join(parts, ", "), nil
}
