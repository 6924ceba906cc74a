// Package slowness scales the fixed waits of tests that drive real
// sandboxes by how slow the machine running them is. scripts/test.sh
// measures the machine once (`go run ./bench -slowness`: a raw runsc
// create → first exec, against Reference) and exports the factor as
// LIZARD_TEST_SLOWNESS; a test's deadline of d is Scale(d). For tests and
// bench only.
package slowness

import (
	"fmt"
	"os"
	"strconv"
	"sync"
	"time"
)

// Env is the environment variable that carries the factor.
const Env = "LIZARD_TEST_SLOWNESS"

// Reference is a raw runsc create → first exec of the base template on
// the machine the tests' waits were set on: a machine that takes this long
// has factor 1.
const Reference = 95 * time.Millisecond

// Of is the factor of a machine whose raw runsc create → first exec took
// measured: measured / Reference, never below 1 (the waits were set on a
// fast machine; a faster one keeps them).
func Of(measured time.Duration) float64 {
	return max(1, float64(measured)/float64(Reference))
}

// Parse reads a factor as Env carries it: a number, 1 when s is empty;
// below 1 counts as 1.
func Parse(s string) (float64, error) {
	if s == "" {
		return 1, nil
	}
	f, err := strconv.ParseFloat(s, 64)
	if err != nil || f != f || f > 1000 {
		return 0, fmt.Errorf("%s=%q: want a number from 1 to 1000 (the machine's slowness factor)", Env, s)
	}
	return max(1, f), nil
}

// Factor is the factor in Env (1 when unset), read once. A value that is
// not a number panics: waits scaled by a mistaken factor would fail or
// hang far from the cause.
var Factor = sync.OnceValue(func() float64 {
	f, err := Parse(os.Getenv(Env))
	if err != nil {
		panic(err)
	}
	return f
})

// Scale is d stretched by Factor: never shorter than d.
func Scale(d time.Duration) time.Duration {
	return time.Duration(float64(d) * Factor())
}
