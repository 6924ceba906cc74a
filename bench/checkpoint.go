package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"time"
)

// The checkpoint measurements: pause, resume, snapshot, restore, warm-pool
// restore and fork, on an idle sandbox and on one holding 256 MiB, beside
// runsc checkpoint and restore doing the same.

// hold256 makes a process keep 256 MiB of incompressible memory.
const hold256 = `nohup python3 -c 'import os, time; b = os.urandom(256 << 20); time.sleep(1e9)' >/dev/null 2>&1 & sleep 2`

// createHolding creates a sandbox through s, idle or (big) with a process
// holding 256 MiB of incompressible memory; kill removes it.
func createHolding(s *server, big bool) (id string, kill func(), err error) {
	if id, err = s.create(); err != nil {
		return "", nil, err
	}
	kill = func() { s.kill(id) }
	if big {
		if err := s.call("POST", "/api/sandboxes/"+id+"/exec", map[string]any{"cmd": hold256}, nil); err != nil {
			kill()
			return "", nil, err
		}
	}
	return id, kill, nil
}

func (s *server) post(path string, body any, out any) error { return s.call("POST", path, body, out) }

func benchCheckpoints(ctx context.Context, s *server, raw *rawRunsc, n int, big bool) ([]result, error) {
	suffix := " (idle)"
	if big {
		suffix = " (256 MiB)"
	}
	var rs []result
	id, kill, err := createHolding(s, big)
	if err != nil {
		return nil, err
	}
	defer kill()
	var holder []string
	if big {
		holder = rawHolder
	}
	rid, err := raw.start(ctx, holder...)
	if err != nil {
		return nil, err
	}
	defer raw.destroy(rid)
	if big {
		if err := raw.waitHeld(ctx, rid); err != nil {
			return nil, err
		}
	}

	// pause, then resume → first exec
	rawPages := int64(0)
	pause := result{name: "pause" + suffix}
	resume := result{name: "resume → first exec" + suffix}
	for range n {
		t := time.Now()
		if err := s.post("/api/sandboxes/"+id+"/pause", nil, nil); err != nil {
			return nil, err
		}
		pause.lizard = append(pause.lizard, time.Since(t))
		t = time.Now()
		if err := s.post("/api/sandboxes/"+id+"/resume", nil, nil); err != nil {
			return nil, err
		}
		if err := s.execTrue(id); err != nil {
			return nil, err
		}
		resume.lizard = append(resume.lizard, time.Since(t))

		img := filepath.Join(raw.dir, "pause-img")
		t = time.Now()
		if err := raw.checkpoint(ctx, rid, img, false); err != nil {
			return nil, err
		}
		pause.floor = append(pause.floor, time.Since(t))
		rawPages = pagesMiB(img)
		if err := holds(img, big); err != nil {
			return nil, err
		}
		t = time.Now()
		if err := raw.restoreAs(ctx, rid, img); err != nil {
			return nil, err
		}
		if err := raw.exec(ctx, rid, nil, "true"); err != nil {
			return nil, err
		}
		resume.floor = append(resume.floor, time.Since(t))
		os.RemoveAll(img)
	}
	pause.note = fmt.Sprintf("runsc: checkpoint (the container stops) + delete; raw image pages %d MiB", rawPages)
	resume.note = "runsc: restore --detach from the image + runsc exec true"
	rs = append(rs, pause, resume)

	// snapshot, restore → first exec, warm-pool restore
	snap := result{name: "snapshot" + suffix}
	restore := result{name: "restore → first exec" + suffix}
	var snapID string
	for i := range n {
		var sn struct {
			ID string `json:"id"`
		}
		t := time.Now()
		if err := s.post("/api/sandboxes/"+id+"/snapshot", map[string]any{"name": "bench", "poolSize": 0}, &sn); err != nil {
			return nil, err
		}
		snap.lizard = append(snap.lizard, time.Since(t))
		img := filepath.Join(raw.dir, fmt.Sprintf("snap-%d", i))
		os.RemoveAll(img) // an earlier pass's (idle, then busy)
		t = time.Now()
		if err := raw.checkpoint(ctx, rid, img, true); err != nil {
			return nil, err
		}
		snap.floor = append(snap.floor, time.Since(t))
		if err := holds(img, big); err != nil {
			return nil, err
		}

		t = time.Now()
		cid, err := s.restoreSnapshot(sn.ID)
		if err != nil {
			return nil, err
		}
		if err := s.execTrue(cid); err != nil {
			return nil, err
		}
		restore.lizard = append(restore.lizard, time.Since(t))
		s.kill(cid)
		if i < n-1 {
			s.call("DELETE", "/api/sandbox-snapshots/"+sn.ID, nil, nil)
		} else {
			snapID = sn.ID
		}
		t = time.Now()
		nid, err := raw.restoreNew(ctx, img, holder...)
		if err != nil {
			return nil, err
		}
		if err := raw.exec(ctx, nid, nil, "true"); err != nil {
			return nil, err
		}
		restore.floor = append(restore.floor, time.Since(t))
		raw.destroy(nid)
		if i < n-1 {
			os.RemoveAll(img)
		}
	}
	defer s.call("DELETE", "/api/sandbox-snapshots/"+snapID, nil, nil)
	snap.note = "runsc: checkpoint --leave-running"
	restore.note = "runsc: restore --detach of the image into a new container + runsc exec true"
	rs = append(rs, snap, restore)

	pool := result{name: "warm-pool restore → first exec" + suffix, floor: restore.floor,
		note: "floor: the raw restore above (a pool copy is restored ahead of the claim)"}
	if err := s.call("PATCH", "/api/sandbox-snapshots/"+snapID, map[string]any{"poolSize": 1}, nil); err != nil {
		return nil, err
	}
	for range n {
		if err := s.waitPool(snapID, 1); err != nil {
			return nil, err
		}
		t := time.Now()
		cid, err := s.restoreSnapshot(snapID)
		if err != nil {
			return nil, err
		}
		if err := s.execTrue(cid); err != nil {
			return nil, err
		}
		pool.lizard = append(pool.lizard, time.Since(t))
		s.kill(cid)
	}
	s.call("PATCH", "/api/sandbox-snapshots/"+snapID, map[string]any{"poolSize": 0}, nil)
	rs = append(rs, pool)

	// fork of 1 and of 10
	for _, count := range []int{1, 10} {
		if big && count == 10 {
			continue // 10 copies of 256 MiB do not fit beside the rest on this machine's budget
		}
		fork := result{name: fmt.Sprintf("fork of %d%s", count, suffix)}
		runs := max(1, n/2)
		for range runs {
			var out []struct {
				Sandbox *struct {
					SandboxID string `json:"sandboxId"`
				} `json:"sandbox"`
				Error string `json:"error"`
			}
			t := time.Now()
			if err := s.post("/api/sandboxes/"+id+"/fork", map[string]any{"count": count}, &out); err != nil {
				return nil, err
			}
			fork.lizard = append(fork.lizard, time.Since(t))
			for _, f := range out {
				if f.Sandbox == nil {
					return nil, fmt.Errorf("fork: %s", f.Error)
				}
				s.kill(f.Sandbox.SandboxID)
			}
			img := filepath.Join(raw.dir, "fork-img")
			t = time.Now()
			if err := raw.checkpoint(ctx, rid, img, true); err != nil {
				return nil, err
			}
			if err := holds(img, big); err != nil {
				return nil, err
			}
			ids, err := raw.restoreMany(ctx, img, count, holder...)
			if err != nil {
				return nil, err
			}
			fork.floor = append(fork.floor, time.Since(t))
			for _, x := range ids {
				raw.destroy(x)
			}
			os.RemoveAll(img)
		}
		fork.note = "runsc: checkpoint --leave-running + that many restores, 4 at a time"
		rs = append(rs, fork)
	}

	// Last: a files-only resume ends the processes the rows above keep.
	files, err := benchFilesPause(ctx, s, raw, id, rid, n, big, suffix)
	if err != nil {
		return nil, err
	}
	return append(rs, files...), nil
}

func (s *server) restoreSnapshot(snapID string) (string, error) {
	var sb struct {
		SandboxID string `json:"sandboxId"`
	}
	err := s.post("/api/sandboxes", map[string]any{"snapshotId": snapID, "timeoutMs": 600000}, &sb)
	return sb.SandboxID, err
}

func (s *server) waitPool(snapID string, want int) error {
	for range 600 {
		var sn struct {
			ReadyCount int `json:"readyCount"`
		}
		if err := s.call("GET", "/api/sandbox-snapshots/"+snapID, nil, &sn); err != nil {
			return err
		}
		if sn.ReadyCount >= want {
			return nil
		}
		time.Sleep(20 * time.Millisecond)
	}
	return fmt.Errorf("warm pool of %s did not fill", snapID)
}

// --- raw runsc ---

// rawHolder is the floor's 256 MiB holder, the same program as lizard's:
// the raw container's own process (a process `runsc exec` starts is not
// saved by a checkpoint, so the floor's images after the first were idle).
// A boot over a files-only image keeps /tmp/held: the holder removes it
// first.
var rawHolder = []string{"python3", "-c", "import os, time; os.path.exists('/tmp/held') and os.remove('/tmp/held'); b = os.urandom(256 << 20); open('/tmp/held', 'w').close(); time.sleep(1e9)"}

// waitHeld waits until the raw container's holder holds its memory.
func (r *rawRunsc) waitHeld(ctx context.Context, id string) error {
	for range 100 {
		if r.exec(ctx, id, nil, "test", "-e", "/tmp/held") == nil {
			return nil
		}
		time.Sleep(100 * time.Millisecond)
	}
	return fmt.Errorf("the raw memory holder did not start")
}

func (r *rawRunsc) checkpoint(ctx context.Context, id, img string, leaveRunning bool) error {
	args := []string{"checkpoint", "--image-path", img}
	if leaveRunning {
		args = append(args, "--leave-running")
	}
	if out, err := r.cmd(ctx, append(args, id)...).CombinedOutput(); err != nil {
		return fmt.Errorf("runsc checkpoint: %v %s", err, out)
	}
	if !leaveRunning {
		r.cmd(ctx, "delete", "--force", id).Run()
	}
	return nil
}

// restoreAs restores id (its bundle is still in place) from img.
func (r *rawRunsc) restoreAs(ctx context.Context, id, img string) error {
	cdir := filepath.Join(r.dir, id)
	// The restored container keeps the command's stdout and stderr: a file,
	// not a pipe that would never reach EOF.
	log, err := os.OpenFile(filepath.Join(cdir, "console.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	defer log.Close()
	c := r.cmd(ctx, "--overlay2", "root:dir="+filepath.Join(cdir, "overlay"), "restore", "--detach",
		"--image-path", img, "--bundle", filepath.Join(cdir, "bundle"), id)
	c.Stdout, c.Stderr = log, log
	if err := c.Run(); err != nil {
		return fmt.Errorf("runsc restore: %v", err)
	}
	return nil
}

// restoreNew restores img into a new container whose process was argv
// (the spec must be the checkpointed container's).
func (r *rawRunsc) restoreNew(ctx context.Context, img string, argv ...string) (string, error) {
	id, err := r.prepare(argv...)
	if err != nil {
		return "", err
	}
	return id, r.restoreAs(ctx, id, img)
}

func (r *rawRunsc) restoreMany(ctx context.Context, img string, n int, argv ...string) ([]string, error) {
	ids := make([]string, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	sem := make(chan struct{}, 4)
	for i := range ids {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sem <- struct{}{}
			defer func() { <-sem }()
			ids[i], errs[i] = r.restoreNew(ctx, img, argv...)
		}()
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return ids, err
		}
	}
	return ids, nil
}

// benchFilesPause measures a files-only pause ({"memory": false}) and its
// resume → first exec of sandbox id beside runsc fscheckpoint and a boot
// over its image of container rid, and the resume beside a create of the
// same template through lizard (the target: a files-only resume costs what
// a create does). A files-only resume ends the sandbox's processes: a big
// one is given its 256 MiB holder again before each pause (untimed).
func benchFilesPause(ctx context.Context, s *server, raw *rawRunsc, id, rid string, n int, big bool, suffix string) ([]result, error) {
	pause := result{name: "files-only pause" + suffix}
	resume := result{name: "files-only resume → first exec" + suffix}
	vsCreate := result{name: "files-only resume vs lizard create → first exec" + suffix}
	for range n {
		if big {
			if err := s.call("POST", "/api/sandboxes/"+id+"/exec", map[string]any{"cmd": hold256}, nil); err != nil {
				return nil, err
			}
			// Booted over its files, the container's process is the
			// holder again.
			if err := raw.waitHeld(ctx, rid); err != nil {
				return nil, err
			}
		}
		t := time.Now()
		if err := s.post("/api/sandboxes/"+id+"/pause", map[string]any{"memory": false}, nil); err != nil {
			return nil, err
		}
		pause.lizard = append(pause.lizard, time.Since(t))
		t = time.Now()
		if err := s.post("/api/sandboxes/"+id+"/resume", nil, nil); err != nil {
			return nil, err
		}
		if err := s.execTrue(id); err != nil {
			return nil, err
		}
		d := time.Since(t)
		resume.lizard = append(resume.lizard, d)
		vsCreate.lizard = append(vsCreate.lizard, d)

		t = time.Now()
		cid, err := s.create()
		if err == nil {
			err = s.execTrue(cid)
		}
		vsCreate.floor = append(vsCreate.floor, time.Since(t))
		if cid != "" {
			s.kill(cid)
		}
		if err != nil {
			return nil, err
		}

		img := filepath.Join(raw.dir, "fs-img")
		t = time.Now()
		if out, err := raw.cmd(ctx, "fscheckpoint", "--image-path", img, rid).CombinedOutput(); err != nil {
			return nil, fmt.Errorf("runsc fscheckpoint: %v %s", err, out)
		}
		raw.cmd(ctx, "delete", "--force", rid).Run()
		pause.floor = append(pause.floor, time.Since(t))
		t = time.Now()
		if err := raw.bootFrom(ctx, rid, img); err != nil {
			return nil, err
		}
		if err := raw.exec(ctx, rid, nil, "true"); err != nil {
			return nil, err
		}
		resume.floor = append(resume.floor, time.Since(t))
		os.RemoveAll(img)
	}
	pause.note = "runsc: fscheckpoint (the container stops) + delete"
	resume.note = "runsc: create --fs-restore-image-path + start + runsc exec true"
	vsCreate.note = "floor: a lizard create of the same template → first exec"
	return []result{pause, resume, vsCreate}, nil
}

// bootFrom creates and starts id (its bundle is still in place) afresh
// over the files of the files-only image img.
func (r *rawRunsc) bootFrom(ctx context.Context, id, img string) error {
	cdir := filepath.Join(r.dir, id)
	log, err := os.OpenFile(filepath.Join(cdir, "console.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	defer log.Close()
	c := r.cmd(ctx, "--overlay2", "root:dir="+filepath.Join(cdir, "overlay"), "create", "--fs-restore-image-path", img,
		"--bundle", filepath.Join(cdir, "bundle"), id)
	c.Stdout, c.Stderr = log, log
	if err := c.Run(); err != nil {
		return fmt.Errorf("runsc create --fs-restore-image-path: %v", err)
	}
	if out, err := r.cmd(ctx, "start", id).CombinedOutput(); err != nil {
		return fmt.Errorf("runsc start: %v %s", err, out)
	}
	return nil
}

// pagesMiB is the size of the memory pages in checkpoint image img, in
// MiB (-1 when unreadable): that the floor's image holds what lizard's
// does.
func pagesMiB(img string) int64 {
	fi, err := os.Stat(filepath.Join(img, "pages.img"))
	if err != nil {
		return -1
	}
	return fi.Size() >> 20
}

// holds checks that the floor's image img holds the 256 MiB of its
// holder when big: a floor that lost its memory measures an idle sandbox.
func holds(img string, big bool) error {
	if n := pagesMiB(img); big && n < 256 {
		return fmt.Errorf("the floor's image holds %d MiB of pages, not the 256 MiB of its holder", n)
	}
	return nil
}
