package template

import (
	"context"
	"errors"
	"io"

	"github.com/lizard-build/lizard/internal/codeinterp"
	"github.com/lizard-build/lizard/internal/errdefs"
)

// derivation is a built-in template that is another built-in's rootfs with
// a start command of its own: it is never built or stored itself; it is its
// base, read under its own name, so it follows every rebuild of the base
// and costs no disk.
type derivation struct {
	Base         string
	StartCommand []string
	ReadyCommand []string
	// Revision of what the start command runs: part of the version, so a
	// new program gets a ready state of its own.
	Revision string
	// CodeInterpreter: the sandboxes need the code-interpreter server
	// (internal/codeinterp) mounted at codeinterp.SandboxPath.
	CodeInterpreter bool
}

// derived are the derived built-in templates.
var derived = map[string]derivation{
	// code-interpreter-v1 is what E2B's code-interpreter SDK boots: the
	// interpreter rootfs running lizard's code-interpreter server
	// (internal/codeinterp, mounted by the sandbox service) on port 49999;
	// the server and its default Python kernel are up in the ready state.
	"code-interpreter-v1": {
		Base:            "interpreter",
		StartCommand:    codeinterp.StartCommand(),
		ReadyCommand:    codeinterp.ReadyCommand(),
		Revision:        codeinterp.Revision(),
		CodeInterpreter: true,
	},
}

// NeedsCodeInterpreter tells whether the sandboxes of template name (or
// alias), and every checkpoint of one, need the code-interpreter server
// mounted: only those of code-interpreter-v1 do. A project's template
// cannot take a built-in's name, so the name alone decides.
func NeedsCodeInterpreter(name string) bool {
	return derived[Resolve(name)].CodeInterpreter
}

// getDerived returns derived template name read from its base's current
// version.
func (r *Registry) getDerived(name string, d derivation) (Template, error) {
	t, err := r.Get(d.Base)
	if errors.Is(err, errdefs.ErrNotFound) {
		return Template{}, notFound(name, "its base template "+d.Base+" is not built")
	}
	if err != nil {
		return Template{}, err
	}
	return d.apply(name, t), nil
}

// apply makes template name of its base's version t. Its Digest stays
// t's: it names the version directory the derived template runs on, which
// is what another node must hold.
func (d derivation) apply(name string, t Template) Template {
	t.Name = name
	t.Version += "+" + d.Revision
	t.Aliases = AliasesOf(name)
	t.StartCommand = d.StartCommand
	t.ReadyCommand = d.ReadyCommand
	t.Entrypoint, t.Cmd = nil, d.StartCommand
	t.OnDemand = true
	return t
}

// withDerived adds to the built templates ts the derived ones whose base is
// among them.
func withDerived(ts []Template) []Template {
	out := ts
	for name, d := range derived {
		for _, t := range ts {
			if t.Name == d.Base {
				out = append(out, d.apply(name, t))
			}
		}
	}
	return out
}

// buildDerived builds (or, if ensure, makes sure there is) the base of
// derived template name, and returns name.
func (r *Registry) buildDerived(ctx context.Context, name string, d derivation, progress io.Writer, ensure bool) (Template, error) {
	var err error
	if ensure {
		_, err = r.EnsureBuilt(ctx, d.Base, progress)
	} else {
		_, err = r.Build(ctx, d.Base, progress)
	}
	if err != nil {
		return Template{}, err
	}
	return r.getDerived(name, d)
}
