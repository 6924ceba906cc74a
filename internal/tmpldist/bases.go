package tmpldist

import (
	"bufio"
	"bytes"
	"slices"
	"strings"

	"github.com/lizard-build/lizard/internal/template"
)

// FetchBases brings the templates a Dockerfile's FROM lines name (bare
// template names, not image references) to this node before a build of
// project's, so that a build on any node can start from a template built
// on another. What cannot be fetched is left to the build, which reports
// it.
func (d *Dist) FetchBases(project string, dockerfile []byte) {
	if !d.Enabled() {
		return
	}
	for _, name := range fromTemplates(dockerfile) {
		if _, err := d.Lookup(project, name); err != nil {
			d.log.Debug("templates: base of a build not fetched", "template", name, "err", err)
		}
	}
}

// fromTemplates lists the template names a Dockerfile's FROM lines name:
// the first word after FROM and its flags, when it is not an image
// reference, an earlier stage or a variable.
func fromTemplates(dockerfile []byte) []string {
	var out []string
	stages := map[string]bool{}
	sc := bufio.NewScanner(bytes.NewReader(dockerfile))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) < 2 || !strings.EqualFold(f[0], "FROM") {
			continue
		}
		f = f[1:]
		for len(f) > 0 && strings.HasPrefix(f[0], "--") {
			f = f[1:]
		}
		if len(f) == 0 {
			continue
		}
		name := f[0]
		if !strings.ContainsAny(name, "/:@$") && !stages[strings.ToLower(name)] && !template.IsBuiltin(name) && !slices.Contains(out, name) {
			out = append(out, name)
		}
		if len(f) >= 3 && strings.EqualFold(f[1], "AS") {
			stages[strings.ToLower(f[2])] = true
		}
	}
	return out
}
