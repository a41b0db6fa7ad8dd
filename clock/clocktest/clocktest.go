// Package clocktest holds the helpers that timing tests on a fake clock
// (clock.Fake) share: a bound on the test's waits, a way to run the call
// under test in the background, and a fixed start time.
package clocktest

import (
	"context"
	"testing"
	"time"
)

// Epoch is a fixed start time for fake clocks, so that failures print the
// same times on every run.
var Epoch = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)

// Context returns a context that ends after d or with the test: it bounds
// the test's waits so that a bug fails the test instead of hanging it. The
// bound is never reached when the code works.
func Context(t testing.TB, d time.Duration) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// Go runs f in a goroutine and returns the channel that receives its
// result, so a test can advance a fake clock while f blocks on it.
func Go(f func() error) <-chan error {
	ch := make(chan error, 1)
	go func() { ch <- f() }()
	return ch
}
