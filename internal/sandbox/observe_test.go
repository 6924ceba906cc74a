package sandbox

import "testing"

// TestMetricsTemplate: a project's template name never becomes a label of
// the unauthenticated metrics; built-ins and their aliases do.
func TestMetricsTemplate(t *testing.T) {
	for name, want := range map[string]string{"base": "base", "python312": "python", "interpreter": "interpreter", "myapp": "custom", "": "custom"} {
		if got := metricsTemplate(name); got != want {
			t.Errorf("metricsTemplate(%q) = %q, want %q", name, got, want)
		}
	}
}
