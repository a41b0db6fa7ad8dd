// Package clock holds the context-aware waits every package shares and the
// Clock abstraction that packages with timing (netem, dht, swarm) accept so
// that tests can drive time by hand.
//
// Production code uses Real, the wall clock; a nil Clock in a config means
// Real (see Or). Tests use a Fake, whose time moves only when Advance is
// called.
package clock

import (
	"context"
	"time"
)

// Clock tells the time and makes timers. Real is the wall clock; Fake is a
// manual clock for tests. Implementations are safe for concurrent use.
type Clock interface {
	// Now returns the current time.
	Now() time.Time
	// NewTimer returns a timer that sends the time on its channel once,
	// after d. A timer with d <= 0 fires at once.
	NewTimer(d time.Duration) Timer
	// NewTicker returns a ticker that sends the time on its channel every
	// d, dropping ticks a slow receiver misses. d must be positive.
	NewTicker(d time.Duration) Ticker
	// Sleep waits for d or until ctx ends, whichever is first; it returns
	// ctx's error if ctx ended (also when d <= 0 and ctx has already
	// ended).
	Sleep(ctx context.Context, d time.Duration) error
	// SleepUntil waits until t or until ctx ends, whichever is first.
	SleepUntil(ctx context.Context, t time.Time) error
}

// Timer is a single event, as time.Timer. Stop and Reset follow the
// semantics of time.Timer since Go 1.23: after they return, no value sent
// before the call is received from C.
type Timer interface {
	// C is the channel on which the time is delivered.
	C() <-chan time.Time
	// Stop prevents the timer from firing; it reports whether the timer
	// was pending.
	Stop() bool
	// Reset makes the timer fire after d; it reports whether the timer was
	// pending.
	Reset(d time.Duration) bool
}

// Ticker delivers ticks at intervals, as time.Ticker.
type Ticker interface {
	// C is the channel on which the ticks are delivered.
	C() <-chan time.Time
	// Stop turns the ticker off; no more ticks are sent.
	Stop()
}

// Real returns the wall clock, backed by package time.
func Real() Clock { return realClock{} }

// Or returns c, or the wall clock if c is nil. Packages call it on the
// optional Clock of their configs.
func Or(c Clock) Clock {
	if c == nil {
		return realClock{}
	}
	return c
}

// Sleep waits for d on the wall clock or until ctx ends, whichever is
// first; it returns ctx's error if ctx ended (also when d <= 0 and ctx has
// already ended).
func Sleep(ctx context.Context, d time.Duration) error { return sleep(ctx, realClock{}, d) }

// SleepUntil waits until t on the wall clock or until ctx ends, whichever
// is first.
func SleepUntil(ctx context.Context, t time.Time) error { return Sleep(ctx, time.Until(t)) }

// sleep implements Clock.Sleep on any clock.
func sleep(ctx context.Context, c Clock, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	t := c.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C():
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

type realClock struct{}

func (realClock) Now() time.Time                   { return time.Now() }
func (realClock) NewTimer(d time.Duration) Timer   { return realTimer{time.NewTimer(d)} }
func (realClock) NewTicker(d time.Duration) Ticker { return realTicker{time.NewTicker(d)} }
func (c realClock) Sleep(ctx context.Context, d time.Duration) error {
	return sleep(ctx, c, d)
}
func (c realClock) SleepUntil(ctx context.Context, t time.Time) error {
	return sleep(ctx, c, time.Until(t))
}

type realTimer struct{ t *time.Timer }

func (t realTimer) C() <-chan time.Time        { return t.t.C }
func (t realTimer) Stop() bool                 { return t.t.Stop() }
func (t realTimer) Reset(d time.Duration) bool { return t.t.Reset(d) }

type realTicker struct{ t *time.Ticker }

func (t realTicker) C() <-chan time.Time { return t.t.C }
func (t realTicker) Stop()               { t.t.Stop() }
