package pipeline

import (
	"context"
	"testing"
	"time"

	"github.com/skyhive/skyhive/clock"
	"github.com/skyhive/skyhive/swarm"
)

func TestParseRunDelay(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want time.Duration
		ok   bool
	}{
		{"326308241 33782876 381\n", 33782876 * time.Nanosecond, true},
		{"0 0 1", 0, true},
		{"12 7", 7 * time.Nanosecond, true},
		{"12\n", 0, false},
		{"", 0, false},
		{"12 x 3\n", 0, false},
		{"12 -5 3\n", 0, false},
	} {
		got, ok := parseRunDelay([]byte(tc.in))
		if got != tc.want || ok != tc.ok {
			t.Errorf("parseRunDelay(%q) = %v, %v; want %v, %v", tc.in, got, ok, tc.want, tc.ok)
		}
	}
}

func TestBusyTime(t *testing.T) {
	ms := time.Millisecond
	for _, tc := range []struct {
		name string
		wall time.Duration
		d    threadTimes
		want time.Duration
	}{
		{"on the thread", 10 * ms, threadTimes{cpu: 6 * ms, waited: 3 * ms}, 6 * ms},
		{"waited for helpers", 10 * ms, threadTimes{cpu: 1 * ms, waited: 3 * ms, blocked: 2}, 7 * ms},
		{"clock skew", 10 * ms, threadTimes{cpu: 11 * ms}, 10 * ms},
		{"clock skew, blocked", 10 * ms, threadTimes{waited: 12 * ms, blocked: 1}, 0},
		{"negative wait", 10 * ms, threadTimes{waited: -1 * ms, blocked: 1}, 10 * ms},
	} {
		if got := busyTime(tc.wall, tc.d); got != tc.want {
			t.Errorf("%s: busyTime(%v, %+v) = %v, want %v", tc.name, tc.wall, tc.d, got, tc.want)
		}
	}
}

// TestOpClockCountsWaitingForOtherThreads: an op whose thread blocks while
// another goroutine computes, as it does around a parallel GEMM, is busy
// for that time (its thread's CPU time, measured before, is not). The
// helper runs for at least d, and blocking is not waiting for a core, so
// busy ≥ d less whatever time the op's thread itself spent runnable but
// waiting for a core (CI's load caused 1.7 ms of that once).
func TestOpClockCountsWaitingForOtherThreads(t *testing.T) {
	const d = 5 * time.Millisecond
	c := startOp()
	before, ok := readThreadTimes() // startOp locked the thread
	if !ok {
		t.Skip("no per-thread clocks here")
	}
	done := make(chan struct{})
	go func() {
		for start := time.Now(); time.Since(start) < d; {
		}
		close(done)
	}()
	<-done
	after, _ := readThreadTimes()
	wall, busy := c.stop()
	// Busy time leaves out only the time the thread waited for a core
	// (under load, e.g. CI running packages in parallel, that is some of
	// the op); the wait for the other goroutine counts in full. The
	// millisecond covers the clock reads between startOp's and ours.
	waited := after.waited - before.waited
	if busy > wall || busy < d-waited-time.Millisecond {
		t.Fatalf("busy %v for an op that waited %v for another goroutine (wall %v, %v waiting for a core)", busy, d, wall, waited)
	}
}

// TestThrottle checks the emulated op time on a fake clock: after an op of
// wall time w and busy time b, a worker slowed down f× sleeps until f·b
// has passed since the op started.
func TestThrottle(t *testing.T) {
	ms := time.Millisecond
	for _, tc := range []struct {
		name             string
		f                float64
		wall, busy, want time.Duration
	}{
		{"8x", 8, 12 * ms, 10 * ms, 68 * ms},
		{"8x, waited for a core", 8, 30 * ms, 5 * ms, 10 * ms},
		{"op already slow enough", 2, 30 * ms, 10 * ms, 0},
		{"full speed", 1, 10 * ms, 10 * ms, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fake := clock.NewFake(time.Unix(0, 0))
			dev, err := swarm.NewDevice("test", tc.f, 0, swarm.WithClock(fake))
			if err != nil {
				t.Fatal(err)
			}
			w := &Worker{dev: dev}
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			done := make(chan struct{})
			go func() {
				w.throttle(ctx, tc.wall, tc.busy)
				close(done)
			}()
			if tc.want > 0 {
				if err := fake.BlockUntil(ctx, 1); err != nil {
					t.Fatal(err)
				}
				fake.Advance(tc.want - time.Microsecond)
				select {
				case <-done:
					t.Fatalf("woke %v early", time.Microsecond)
				default:
				}
				fake.Advance(time.Microsecond)
			}
			select {
			case <-done:
			case <-ctx.Done():
				t.Fatalf("still sleeping after %v (fake clock)", tc.want)
			}
			if fake.Waiters() != 0 {
				t.Fatalf("%d timers left armed", fake.Waiters())
			}
		})
	}
}
