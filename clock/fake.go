package clock

import (
	"context"
	"fmt"
	"sync"
	"time"
)

// Fake is a manual Clock for tests: its time stands still until Advance
// moves it, and its timers and tickers fire only then, in deadline order.
// BlockUntil lets a test wait until the code under test has armed its
// timers, so a test can step through a schedule without real sleeps. A Fake
// is safe for concurrent use.
type Fake struct {
	mu      sync.Mutex
	now     time.Time
	pending []*waiter     // armed timers and tickers
	seq     uint64        // arming order, to break deadline ties
	changed chan struct{} // closed and replaced whenever pending changes
}

// waiter is one armed timer or ticker.
type waiter struct {
	at     time.Time
	period time.Duration // 0 for a timer
	seq    uint64
	ch     chan time.Time // capacity 1
	armed  bool
}

// NewFake returns a fake clock that reads start until advanced.
func NewFake(start time.Time) *Fake {
	return &Fake{now: start, changed: make(chan struct{})}
}

// Now returns the fake time.
func (f *Fake) Now() time.Time {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.now
}

// NewTimer returns a timer that fires when the clock has been advanced by
// d; with d <= 0 it has fired already.
func (f *Fake) NewTimer(d time.Duration) Timer {
	f.mu.Lock()
	defer f.mu.Unlock()
	w := &waiter{ch: make(chan time.Time, 1)}
	f.armLocked(w, d)
	return &fakeTimer{f: f, w: w}
}

// NewTicker returns a ticker that fires every d of fake time. One Advance
// delivers at most one tick per ticker, as a slow receiver of a
// time.Ticker misses ticks. It panics if d <= 0, as time.NewTicker does.
func (f *Fake) NewTicker(d time.Duration) Ticker {
	if d <= 0 {
		panic("clock: non-positive interval for NewTicker")
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	w := &waiter{ch: make(chan time.Time, 1), period: d}
	f.armLocked(w, d)
	return &fakeTicker{f: f, w: w}
}

// Sleep waits until the clock has been advanced by d, or until ctx ends.
func (f *Fake) Sleep(ctx context.Context, d time.Duration) error { return sleep(ctx, f, d) }

// SleepUntil waits until the clock reads t or later, or until ctx ends.
func (f *Fake) SleepUntil(ctx context.Context, t time.Time) error {
	return sleep(ctx, f, t.Sub(f.Now()))
}

// Advance moves the clock forward by d and fires, in deadline order, every
// timer and ticker due by the new time; each receives its own deadline as
// the time. Timers armed by goroutines woken this way count from the new
// time, so to step through a schedule call BlockUntil and Advance in turn.
// It panics if d is negative.
func (f *Fake) Advance(d time.Duration) {
	if d < 0 {
		panic("clock: Advance with a negative duration")
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	target := f.now.Add(d)
	fired := false
	for {
		w := f.nextDueLocked(target)
		if w == nil {
			break
		}
		fired = true
		f.removeLocked(w)
		f.now = w.at
		select {
		case w.ch <- w.at:
		default: // a ticker whose last tick was not received yet
		}
		if w.period > 0 {
			// Re-arm after target: one tick per Advance.
			next := w.at.Add(w.period)
			if !next.After(target) {
				next = next.Add(w.period * (target.Sub(next)/w.period + 1))
			}
			w.at = next
			f.insertLocked(w)
		}
	}
	f.now = target
	if fired {
		f.notifyLocked()
	}
}

// Waiters returns the number of armed timers and tickers: timers that have
// neither fired nor been stopped, and tickers not stopped.
func (f *Fake) Waiters() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.pending)
}

// BlockUntil waits until at least n timers and tickers are armed on the
// clock (see Waiters), typically because n goroutines are sleeping on it.
// It returns ctx's error, wrapped, if ctx ends first.
func (f *Fake) BlockUntil(ctx context.Context, n int) error {
	for {
		f.mu.Lock()
		have, changed := len(f.pending), f.changed
		f.mu.Unlock()
		if have >= n {
			return nil
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return fmt.Errorf("clock: waiting for %d armed timers, have %d: %w", n, have, ctx.Err())
		}
	}
}

// armLocked schedules w to fire d from now; d <= 0 fires it at once.
func (f *Fake) armLocked(w *waiter, d time.Duration) {
	if d <= 0 {
		select {
		case w.ch <- f.now:
		default:
		}
		return
	}
	w.at = f.now.Add(d)
	f.insertLocked(w)
	f.notifyLocked()
}

func (f *Fake) insertLocked(w *waiter) {
	f.seq++
	w.seq = f.seq
	w.armed = true
	f.pending = append(f.pending, w)
}

// disarmLocked removes w if armed and reports whether it was.
func (f *Fake) disarmLocked(w *waiter) bool {
	if !w.armed {
		return false
	}
	f.removeLocked(w)
	f.notifyLocked()
	return true
}

func (f *Fake) removeLocked(w *waiter) {
	for i, p := range f.pending {
		if p == w {
			f.pending = append(f.pending[:i], f.pending[i+1:]...)
			break
		}
	}
	w.armed = false
}

// nextDueLocked returns the armed waiter with the earliest deadline not
// after target (the earliest armed on ties), or nil.
func (f *Fake) nextDueLocked(target time.Time) *waiter {
	var best *waiter
	for _, w := range f.pending {
		if w.at.After(target) {
			continue
		}
		if best == nil || w.at.Before(best.at) || (w.at.Equal(best.at) && w.seq < best.seq) {
			best = w
		}
	}
	return best
}

func (f *Fake) notifyLocked() {
	close(f.changed)
	f.changed = make(chan struct{})
}

// drain discards a value already sent on ch, so that none sent before a
// Stop or Reset is received after it.
func drain(ch chan time.Time) {
	select {
	case <-ch:
	default:
	}
}

type fakeTimer struct {
	f *Fake
	w *waiter
}

func (t *fakeTimer) C() <-chan time.Time { return t.w.ch }

func (t *fakeTimer) Stop() bool {
	t.f.mu.Lock()
	defer t.f.mu.Unlock()
	was := t.f.disarmLocked(t.w)
	drain(t.w.ch)
	return was
}

func (t *fakeTimer) Reset(d time.Duration) bool {
	t.f.mu.Lock()
	defer t.f.mu.Unlock()
	was := t.f.disarmLocked(t.w)
	drain(t.w.ch)
	t.f.armLocked(t.w, d)
	return was
}

type fakeTicker struct {
	f *Fake
	w *waiter
}

func (t *fakeTicker) C() <-chan time.Time { return t.w.ch }

func (t *fakeTicker) Stop() {
	t.f.mu.Lock()
	defer t.f.mu.Unlock()
	t.f.disarmLocked(t.w)
}
