// Package schedule is a feature over the sandbox service's core: a
// sandbox's schedules (the Lizard SDK's sandbox.schedule() and the
// /api/sandbox-schedules routes), which run a shell command or a coding
// agent's prompt in the sandbox every interval or on a cron expression,
// waking a paused sandbox for the run and putting it back to sleep after.
// Schedules and their runs live in the store (store.Schedules); each due
// time is claimed there, fenced in a cluster, so it runs once across
// restarts and nodes. It takes the core through Core; only cmd/lizard
// wires it, and the API calls it through api.Schedules.
package schedule
