package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strconv"

	"github.com/lizard-build/lizard/internal/sandbox"
	"github.com/lizard-build/lizard/internal/store"
)

// limitFlag is one --max-… flag of `projects set`: unset, a number, or
// "default" (back to the server's default).
type limitFlag struct {
	set   bool
	value *int
}

func (f *limitFlag) String() string {
	if f == nil || !f.set {
		return ""
	}
	if f.value == nil {
		return "default"
	}
	return strconv.Itoa(*f.value)
}

func (f *limitFlag) Set(s string) error {
	f.set = true
	if s == "default" {
		f.value = nil
		return nil
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < 0 {
		return fmt.Errorf("%q: must be 0 (no limit) or more, or \"default\"", s)
	}
	f.value = &n
	return nil
}

func projects(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("projects", flag.ContinueOnError)
	dataDir := fs.String("data-dir", defaultDataDir, "state directory")
	database := fs.String("database", "", databaseUsage)
	flags := map[store.Limit]*limitFlag{}
	for _, l := range store.AllLimits {
		flags[l] = &limitFlag{}
		fs.Var(flags[l], "max-"+string(l), "the project's limit of "+string(l)+` (0: none; "default": the server's)`)
	}
	pos, err := configure(fs, args)
	if err != nil {
		return err
	}
	st, err := openStore(ctx, *dataDir, *database)
	if err != nil {
		return err
	}
	defer st.Close()
	switch {
	case len(pos) == 2 && pos[0] == "create":
		p, err := st.CreateProject(ctx, pos[1], "")
		if err != nil {
			return err
		}
		fmt.Printf("project %s created (id %s, slug %s)\n", p.Name, p.ID, p.Slug)
		return nil
	case len(pos) == 1 && (pos[0] == "ls" || pos[0] == "list"):
		return listProjects(ctx, st, os.Stdout)
	case len(pos) == 2 && pos[0] == "set":
		p, err := st.ProjectByRef(ctx, pos[1])
		if err != nil {
			return err
		}
		changed := false
		for _, l := range store.AllLimits {
			if f := flags[l]; f.set {
				if err := st.SetProjectLimit(ctx, p.ID, l, f.value); err != nil {
					return err
				}
				changed = true
			}
		}
		if !changed {
			return errors.New("projects set: give at least one --max-… flag\n" + usage)
		}
		return listProjects(ctx, st, os.Stdout, p.ID)
	}
	return errors.New(usage)
}

// listProjects prints the projects (only those of ids, if given) with each
// limit as "in use/limit": the limit is the project's own when it has one
// (marked *), else the server's default; "-" is no limit.
func listProjects(ctx context.Context, st store.Store, out io.Writer, ids ...string) error {
	ps, err := st.Projects(ctx)
	if err != nil {
		return err
	}
	defaults, known, err := st.DefaultLimits(ctx)
	if err != nil {
		return err
	}
	use, err := sandbox.StoredUsage(ctx, st)
	if err != nil {
		return err
	}
	tw := newTabWriter(out)
	fmt.Fprintln(tw, "ID\tSLUG\tNAME\tSANDBOXES\tVCPUS\tMEMORY_GB\tVOLUME_GB\tSNAPSHOTS\tSCHEDULES\tSCHEDULES_PER_SANDBOX")
	for _, p := range ps {
		if len(ids) > 0 && p.ID != ids[0] {
			continue
		}
		o, err := st.ProjectOverrides(ctx, p.ID)
		if err != nil {
			return err
		}
		u := use[p.ID]
		used := map[store.Limit]string{
			store.LimitSandboxes: strconv.Itoa(u.Sandboxes),
			store.LimitVCPUs:     strconv.FormatFloat(u.VCPUs, 'f', -1, 64),
			store.LimitMemoryGB:  strconv.FormatFloat(float64(u.MemoryMB)/1024, 'f', -1, 64),
			store.LimitVolumeGB:  strconv.Itoa(u.VolumeGB),
			store.LimitSnapshots: strconv.Itoa(u.Snapshots),
		}
		if err := scheduleUse(ctx, st, p.ID, used); err != nil {
			return err
		}
		fmt.Fprintf(tw, "%s\t%s\t%s", p.ID, p.Slug, p.Name)
		for _, l := range store.AllLimits {
			limit, mark := "?", ""
			if v, ok := o[l]; ok {
				limit, mark = limitText(v), "*"
			} else if known {
				limit = limitText(*defaults.Field(l))
			}
			fmt.Fprintf(tw, "\t%s/%s%s", used[l], limit, mark)
		}
		fmt.Fprintln(tw)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if !known {
		fmt.Fprintln(out, "(? : the server's default; no server has run on this data directory yet)")
	}
	return nil
}

// scheduleUse sets the project's schedules in use: how many it has, and
// how many its sandbox with the most has.
func scheduleUse(ctx context.Context, st store.Store, projectID string, used map[store.Limit]string) error {
	ss, ok := st.(store.Schedules)
	if !ok {
		return nil
	}
	l, err := ss.Schedules(ctx, projectID, "")
	if err != nil {
		return err
	}
	per, most := map[string]int{}, 0
	for _, sc := range l {
		per[sc.SandboxID]++
		most = max(most, per[sc.SandboxID])
	}
	used[store.LimitSchedules], used[store.LimitSchedulesPerSandbox] = strconv.Itoa(len(l)), strconv.Itoa(most)
	return nil
}

func limitText(v int) string {
	if v == 0 {
		return "-"
	}
	return strconv.Itoa(v)
}
