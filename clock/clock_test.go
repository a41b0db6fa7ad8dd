package clock

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/skyhive/skyhive/clock/clocktest"
)

func TestSleepEndsWithContext(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := Sleep(ctx, time.Hour); !errors.Is(err, context.Canceled) {
		t.Fatalf("got %v", err)
	}
	if err := Sleep(ctx, 0); !errors.Is(err, context.Canceled) {
		t.Fatalf("zero wait on an ended context: %v", err)
	}
	if err := Sleep(context.Background(), time.Microsecond); err != nil {
		t.Fatal(err)
	}
	if err := SleepUntil(context.Background(), time.Now().Add(-time.Second)); err != nil {
		t.Fatal(err)
	}
}

var epoch = clocktest.Epoch

func ctxT(t testing.TB) context.Context { return clocktest.Context(t, 10*time.Second) }

func received(c <-chan time.Time) (time.Time, bool) {
	select {
	case v := <-c:
		return v, true
	default:
		return time.Time{}, false
	}
}

func TestRealClock(t *testing.T) {
	c := Real()
	if Or(nil) != c {
		t.Error("Or(nil) is not the real clock")
	}
	f := NewFake(epoch)
	if Or(f) != Clock(f) {
		t.Error("Or(f) is not f")
	}
	before := time.Now()
	if now := c.Now(); now.Before(before) {
		t.Errorf("Real().Now() = %v before time.Now() = %v", now, before)
	}
	tm := c.NewTimer(time.Millisecond)
	<-tm.C()
	if tm.Stop() {
		t.Error("Stop of a fired timer reported it pending")
	}
	tk := c.NewTicker(time.Millisecond)
	<-tk.C()
	tk.Stop()
	if err := c.Sleep(context.Background(), time.Microsecond); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := c.SleepUntil(ctx, time.Now().Add(time.Hour)); !errors.Is(err, context.Canceled) {
		t.Fatalf("got %v", err)
	}
}

func TestFakeTimerFiresAtDeadline(t *testing.T) {
	f := NewFake(epoch)
	if !f.Now().Equal(epoch) {
		t.Fatalf("Now = %v", f.Now())
	}
	tm := f.NewTimer(10 * time.Second)
	if f.Waiters() != 1 {
		t.Fatalf("%d waiters, want 1", f.Waiters())
	}
	f.Advance(10*time.Second - time.Nanosecond)
	if _, ok := received(tm.C()); ok {
		t.Fatal("fired a nanosecond early")
	}
	f.Advance(time.Nanosecond)
	v, ok := received(tm.C())
	if !ok || !v.Equal(epoch.Add(10*time.Second)) {
		t.Fatalf("fired %v %v, want at epoch+10s", v, ok)
	}
	if f.Waiters() != 0 || tm.Stop() {
		t.Fatalf("a fired timer is still armed (%d waiters)", f.Waiters())
	}
	if now := f.Now(); !now.Equal(epoch.Add(10 * time.Second)) {
		t.Fatalf("Now = %v", now)
	}
	// A non-positive duration fires at once, without arming.
	z := f.NewTimer(0)
	if v, ok := received(z.C()); !ok || !v.Equal(f.Now()) || f.Waiters() != 0 {
		t.Fatalf("zero timer: %v %v, %d waiters", v, ok, f.Waiters())
	}
}

func TestFakeFiresInDeadlineOrder(t *testing.T) {
	f := NewFake(epoch)
	// Deadlines out of arming order, and two equal ones.
	ds := []time.Duration{3 * time.Second, time.Second, 2 * time.Second, time.Second}
	var timers []Timer
	for _, d := range ds {
		timers = append(timers, f.NewTimer(d))
	}
	f.Advance(time.Hour)
	for i, tm := range timers {
		v, ok := received(tm.C())
		if !ok || !v.Equal(epoch.Add(ds[i])) {
			t.Errorf("timer %d: %v %v, want epoch+%v", i, v, ok, ds[i])
		}
	}
	if !f.Now().Equal(epoch.Add(time.Hour)) {
		t.Errorf("Now = %v after Advance(1h)", f.Now())
	}
}

func TestFakeStopAndReset(t *testing.T) {
	f := NewFake(epoch)
	tm := f.NewTimer(time.Second)
	if !tm.Stop() {
		t.Fatal("Stop of an armed timer reported it idle")
	}
	f.Advance(time.Hour)
	if _, ok := received(tm.C()); ok {
		t.Fatal("a stopped timer fired")
	}
	if tm.Reset(time.Minute) {
		t.Fatal("Reset of a stopped timer reported it armed")
	}
	f.Advance(time.Minute)
	if v, ok := received(tm.C()); !ok || !v.Equal(epoch.Add(time.Hour+time.Minute)) {
		t.Fatalf("reset timer: %v %v", v, ok)
	}
	// A value fired but not received is discarded by Reset and Stop.
	tm.Reset(time.Second)
	f.Advance(time.Second) // fires; the value waits in the channel
	if tm.Reset(time.Second) || f.Waiters() != 1 {
		t.Fatalf("Reset of a fired timer: want it reported idle and re-armed (%d waiters)", f.Waiters())
	}
	if _, ok := received(tm.C()); ok {
		t.Fatal("a value sent before Reset was received after it")
	}
	f.Advance(time.Second)
	if tm.Stop() {
		t.Fatal("Stop of a fired timer reported it armed")
	}
	if _, ok := received(tm.C()); ok {
		t.Fatal("a value sent before Stop was received after it")
	}
}

func TestFakeTicker(t *testing.T) {
	f := NewFake(epoch)
	tk := f.NewTicker(time.Second)
	for i := 1; i <= 3; i++ {
		f.Advance(time.Second)
		if v, ok := received(tk.C()); !ok || !v.Equal(epoch.Add(time.Duration(i)*time.Second)) {
			t.Fatalf("tick %d: %v %v", i, v, ok)
		}
	}
	// A long Advance delivers one tick; the next one is a period after the
	// new time's last multiple, as a time.Ticker drops missed ticks.
	f.Advance(10*time.Second + time.Second/2) // now epoch+13.5s
	if v, ok := received(tk.C()); !ok || !v.Equal(epoch.Add(4*time.Second)) {
		t.Fatalf("tick after long advance: %v %v", v, ok)
	}
	if _, ok := received(tk.C()); ok {
		t.Fatal("more than one tick per Advance")
	}
	f.Advance(time.Second / 2)
	if v, ok := received(tk.C()); !ok || !v.Equal(epoch.Add(14*time.Second)) {
		t.Fatalf("tick on the period grid: %v %v", v, ok)
	}
	tk.Stop()
	f.Advance(time.Hour)
	if _, ok := received(tk.C()); ok || f.Waiters() != 0 {
		t.Fatal("a stopped ticker ticked")
	}
	defer func() {
		if recover() == nil {
			t.Error("NewTicker(0) did not panic")
		}
	}()
	f.NewTicker(0)
}

func TestFakeSleepAndBlockUntil(t *testing.T) {
	f := NewFake(epoch)
	ctx := ctxT(t)
	const n = 8
	done := make(chan time.Time, n)
	for i := range n {
		go func() {
			if err := f.Sleep(ctx, time.Duration(i+1)*time.Minute); err != nil {
				t.Error(err)
			}
			done <- f.Now()
		}()
	}
	if err := f.BlockUntil(ctx, n); err != nil {
		t.Fatal(err)
	}
	for i := range n {
		f.Advance(time.Minute)
		got := <-done
		if want := epoch.Add(time.Duration(i+1) * time.Minute); !got.Equal(want) {
			t.Fatalf("sleeper %d woke at %v, want %v", i, got, want)
		}
		if w := f.Waiters(); w != n-i-1 {
			t.Fatalf("%d waiters after %d wake-ups", w, i+1)
		}
	}
	// SleepUntil a time already reached returns at once.
	if err := f.SleepUntil(ctx, epoch); err != nil {
		t.Fatal(err)
	}
	// Sleep ends with its context and disarms its timer.
	sctx, cancel := context.WithCancel(ctx)
	errc := make(chan error, 1)
	go func() { errc <- f.SleepUntil(sctx, f.Now().Add(time.Hour)) }()
	if err := f.BlockUntil(ctx, 1); err != nil {
		t.Fatal(err)
	}
	cancel()
	if err := <-errc; !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled sleep: %v", err)
	}
	if f.Waiters() != 0 {
		t.Fatal("a cancelled sleep left its timer armed")
	}
	// BlockUntil gives up with its context.
	bctx, bcancel := context.WithCancel(ctx)
	bcancel()
	if err := f.BlockUntil(bctx, 1); !errors.Is(err, context.Canceled) {
		t.Fatalf("BlockUntil on an ended context: %v", err)
	}
}

// TestFakeConcurrent hammers the clock from several goroutines; run with
// -race.
func TestFakeConcurrent(t *testing.T) {
	f := NewFake(epoch)
	ctx := ctxT(t)
	var wg sync.WaitGroup
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := range 200 {
				tm := f.NewTimer(time.Duration(j%5) * time.Millisecond)
				if j%3 == 0 {
					tm.Reset(time.Millisecond)
				}
				tm.Stop()
				_ = f.Sleep(ctx, 0)
			}
		}()
	}
	stop := make(chan struct{})
	advancer := make(chan struct{})
	go func() {
		defer close(advancer)
		for {
			select {
			case <-stop:
				return
			default:
				f.Advance(time.Millisecond)
				_ = f.Waiters()
			}
		}
	}()
	wg.Wait()
	close(stop)
	<-advancer
	if f.Waiters() != 0 {
		t.Fatalf("%d timers still armed after all were stopped", f.Waiters())
	}
}

func TestAdvanceNegativePanics(t *testing.T) {
	defer func() {
		if recover() == nil {
			t.Error("Advance(-1) did not panic")
		}
	}()
	NewFake(epoch).Advance(-1)
}
