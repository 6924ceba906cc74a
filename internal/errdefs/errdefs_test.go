package errdefs

import (
	"errors"
	"fmt"
	"testing"
)

// TestClassNames: every class has a name that gives it back, and the name
// survives wrapping; an error of no class has none.
func TestClassNames(t *testing.T) {
	seen := map[string]bool{}
	for _, c := range order {
		wrapped := WithCode("x", fmt.Errorf("ctx: %w", c.class))
		if n := ClassName(wrapped); n != c.name || ClassNamed(n) != c.class || Class(wrapped) != c.class || seen[n] {
			t.Fatalf("class %v: name %q, back %v", c.class, n, ClassNamed(n))
		}
		seen[c.name] = true
	}
	if ClassName(errors.New("plain")) != "" || Class(errors.New("plain")) != nil || ClassNamed("bogus") != nil {
		t.Fatal("an error of no class got one")
	}
}

// TestDetailed: a Detailed error is of its class, its cause is found by
// errors.As and is in Error, never in ClientMessage.
func TestDetailed(t *testing.T) {
	cause := &customErr{"exit status 1: /srv/secret"}
	d := WithCause(ErrUnavailable, "runsc failed", cause)
	err := fmt.Errorf("sandbox %q: %w", "s1", d)
	var ce *customErr
	if !errors.Is(err, ErrUnavailable) || !errors.As(err, &ce) {
		t.Fatalf("%v: class or cause lost", err)
	}
	if got, want := err.Error(), `sandbox "s1": runsc failed: exit status 1: /srv/secret`; got != want {
		t.Fatalf("Error() = %q, want %q", got, want)
	}
	if got, want := ClientMessage(err), `sandbox "s1": runsc failed`; got != want {
		t.Fatalf("ClientMessage = %q, want %q", got, want)
	}
	if got := ClientMessage(fmt.Errorf("plain: %w", ErrConflict)); got != "plain: conflict" {
		t.Fatalf("ClientMessage of a plain error = %q", got)
	}
	if got := ClientMessage(WithCause(ErrConflict, "exists", nil)); got != "exists" {
		t.Fatalf("ClientMessage without a cause = %q", got)
	}
}

type customErr struct{ s string }

func (e *customErr) Error() string { return e.s }
