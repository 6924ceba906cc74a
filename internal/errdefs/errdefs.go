// Package errdefs defines the small set of error classes shared by every
// lizard package. Packages wrap one of these with context
// (fmt.Errorf("sandbox %q: %w", id, errdefs.ErrNotFound)); the API edge maps
// the class to an HTTP status and a stable code in one place. Any package may
// import it; it imports nothing of lizard's.
package errdefs

import "errors"

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
