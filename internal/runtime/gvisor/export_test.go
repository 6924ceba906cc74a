package gvisor

// HasStateFile exposes hasStateFile to the external tests.
func (r *Runtime) HasStateFile(id string) bool { return r.hasStateFile(id) }
