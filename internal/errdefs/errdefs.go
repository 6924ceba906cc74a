// Package errdefs defines the small set of error classes shared by every
// lizard package. Packages wrap one of these with context
// (fmt.Errorf("sandbox %q: %w", id, errdefs.ErrNotFound)); the API edge maps
// the class to an HTTP status and a stable code in one place. Any package may
// import it; it imports nothing of lizard's.
package errdefs

import (
	"errors"
	"strings"
)

var (
	// ErrInvalid: the caller's input is wrong (a field, a range, a path).
	ErrInvalid = errors.New("invalid argument")
	// ErrNotFound: the named thing does not exist or is not visible to the caller.
	ErrNotFound = errors.New("not found")
	// ErrConflict: the request clashes with the current state of the thing.
	ErrConflict = errors.New("conflict")
	// ErrUnauthenticated: no or a wrong API key.
	ErrUnauthenticated = errors.New("unauthenticated")
	// ErrPermission: the caller (or the sandbox user) may not do this.
	ErrPermission = errors.New("permission denied")
	// ErrLimit: a quota or limit would be exceeded.
	ErrLimit = errors.New("limit exceeded")
	// ErrTimeout: the operation ran out of time.
	ErrTimeout = errors.New("timed out")
	// ErrUnavailable: a dependency (runtime, agent, disk) cannot serve now.
	ErrUnavailable = errors.New("unavailable")
	// ErrTooLarge: a body or file is larger than allowed.
	ErrTooLarge = errors.New("too large")
	// ErrQuota: the caller's project would go over one of its limits.
	ErrQuota = errors.New("quota exceeded")
	// ErrCapacity: the node has no room for this now; retrying later may
	// succeed once others let go.
	ErrCapacity = errors.New("node at capacity")
	// ErrNoSpace: the disk holding the server's state is (nearly) full.
	ErrNoSpace = errors.New("insufficient storage")
)

// Coded is an error that carries a stable machine-readable code for the API,
// e.g. "template_not_found". The class still comes from the wrapped error.
type Coded struct {
	Code string
	Err  error
}

func (e *Coded) Error() string { return e.Err.Error() }
func (e *Coded) Unwrap() error { return e.Err }

// WithCode wraps err so that the API reports code for it.
func WithCode(code string, err error) error { return &Coded{Code: code, Err: err} }

// Code returns the code attached with WithCode, or "".
func Code(err error) string {
	var c *Coded
	if errors.As(err, &c) {
		return c.Code
	}
	return ""
}

// Exceeded details a refusal for a limit (wrap ErrQuota or ErrCapacity in
// Err): the unit limited ("sandboxes", "vcpu", "memory-gb", …), the limit,
// what is in use and what the request needs. The API shows them to clients.
type Exceeded struct {
	Unit                 string
	Limit, InUse, Needed float64
	Err                  error
}

func (e *Exceeded) Error() string { return e.Err.Error() }
func (e *Exceeded) Unwrap() error { return e.Err }

// order is the classes in the order Class tries them: an error that wraps
// two classes is of the first listed (a quota is not reported as the
// limit it also is; a node at capacity not as merely unavailable).
var order = []struct {
	class error
	name  string
}{
	{ErrInvalid, "invalid"},
	{ErrUnauthenticated, "unauthenticated"},
	{ErrPermission, "permission"},
	{ErrNotFound, "not_found"},
	{ErrConflict, "conflict"},
	{ErrTooLarge, "too_large"},
	{ErrQuota, "quota"},
	{ErrLimit, "limit"},
	{ErrCapacity, "capacity"},
	{ErrNoSpace, "no_space"},
	{ErrTimeout, "timeout"},
	{ErrUnavailable, "unavailable"},
}

// Class returns the class err carries (one of the Err values above), or
// nil for an error of no class.
func Class(err error) error {
	for _, c := range order {
		if errors.Is(err, c.class) {
			return c.class
		}
	}
	return nil
}

// ClassName is the stable name of the class err carries ("not_found",
// "capacity", …), or "" for none: how a class travels between nodes.
func ClassName(err error) string {
	for _, c := range order {
		if errors.Is(err, c.class) {
			return c.name
		}
	}
	return ""
}

// ClassNamed is the class of that name (ClassName), or nil.
func ClassNamed(name string) error {
	for _, c := range order {
		if c.name == name {
			return c.class
		}
	}
	return nil
}

// Detailed is an error of a class whose cause must not reach clients: a
// command's output, a host path, a peer's address. Its Error is the whole
// text, for the server's log; ClientMessage shows Msg in its place.
type Detailed struct {
	// Msg names the problem for the client, with nothing of the host.
	Msg string
	// Class is the errdefs class (ErrUnavailable, …).
	Class error
	// Cause is what went wrong, for the log only.
	Cause error
}

// WithCause returns an error of class whose client message is msg and
// whose full text (for the log) adds cause.
func WithCause(class error, msg string, cause error) error {
	return &Detailed{Msg: msg, Class: class, Cause: cause}
}

func (e *Detailed) Error() string {
	if e.Cause == nil {
		return e.Msg
	}
	return e.Msg + ": " + e.Cause.Error()
}

// Unwrap gives the class and the cause (errors.As still finds an
// *exec.ExitError in it). A cause should carry no class of its own: Class
// would see that one too.
func (e *Detailed) Unwrap() []error {
	if e.Cause == nil {
		return []error{e.Class}
	}
	return []error{e.Class, e.Cause}
}

// ClientMessage is err's text as a client may see it: every Detailed error
// in it stands as its Msg alone, the context wrapped around it kept. An
// error whose text does not show a Detailed's (a wrapper that rewords it)
// is answered with that Detailed's Msg alone, so no cause slips through.
func ClientMessage(err error) string {
	if err == nil {
		return ""
	}
	msg := err.Error()
	for _, d := range detailed(err, nil) {
		full := d.Error()
		if !strings.Contains(msg, full) {
			return d.Msg
		}
		msg = strings.Replace(msg, full, d.Msg, 1)
	}
	return msg
}

// detailed appends the Detailed errors in err's tree to out, outermost
// first; a Detailed's own cause is not searched (its text is replaced
// whole).
func detailed(err error, out []*Detailed) []*Detailed {
	switch e := err.(type) {
	case nil:
		return out
	case *Detailed:
		return append(out, e)
	case interface{ Unwrap() error }:
		return detailed(e.Unwrap(), out)
	case interface{ Unwrap() []error }:
		for _, inner := range e.Unwrap() {
			out = detailed(inner, out)
		}
	}
	return out
}
