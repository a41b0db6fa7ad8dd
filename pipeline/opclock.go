package pipeline

import (
	"bytes"
	"runtime"
	"strconv"
	"time"
)

// opClock measures what one piece of compute costs on this machine: its
// wall time and its busy time. An op that ran on the calling thread alone
// (OpenBLAS with one thread, small layers) is busy for its thread's CPU
// time. An op that handed work to other threads and blocked until they
// finished (the Go GEMM kernel and large element-wise layers spread over
// GOMAXPROCS goroutines; OpenBLAS may run threads of its own) is busy for
// its wall time less the time its thread was runnable but waiting for a
// core. (The thread's CPU time alone, used before, missed the helpers'
// work: with the Go kernel a Linear layer's product ran entirely on other
// threads, so an emulated 8× slowdown came out as 1.5–3×. Wall time less
// run-queue wait for every op would also count interrupts and time stolen
// by the hypervisor, which made the short ops of the bench's small model
// 40% dearer.) Either way time lost waiting for a core is left out. Where
// the thread's clocks are unavailable, busy equals wall.
type opClock struct {
	wall time.Time
	t    threadTimes
	ok   bool
}

// threadTimes are the calling thread's clocks.
type threadTimes struct {
	cpu     time.Duration // CPU time
	waited  time.Duration // time runnable, waiting on a run queue
	blocked int64         // voluntary context switches (blocking waits)
}

// startOp locks the goroutine to its thread and starts the clocks; the
// caller must call stop exactly once.
func startOp() opClock {
	runtime.LockOSThread()
	t, ok := readThreadTimes()
	return opClock{wall: time.Now(), t: t, ok: ok}
}

// stop unlocks the thread and returns the op's wall and busy time.
func (o opClock) stop() (wall, busy time.Duration) {
	wall = time.Since(o.wall)
	t, ok := readThreadTimes()
	runtime.UnlockOSThread()
	if !o.ok || !ok {
		return wall, wall
	}
	return wall, busyTime(wall, threadTimes{cpu: t.cpu - o.t.cpu, waited: t.waited - o.t.waited, blocked: t.blocked - o.t.blocked})
}

// busyTime is the busy part of an op of the given wall time during which
// the thread's clocks advanced by d, within [0, wall] (the clocks are read
// at slightly different instants).
func busyTime(wall time.Duration, d threadTimes) time.Duration {
	busy := d.cpu
	if d.blocked > 0 {
		busy = wall - max(d.waited, 0)
	}
	return min(max(busy, 0), wall)
}

// parseRunDelay extracts the run-queue wait in ns, the second field, from
// the contents of a Linux schedstat file.
func parseRunDelay(b []byte) (time.Duration, bool) {
	f := bytes.Fields(b)
	if len(f) < 2 {
		return 0, false
	}
	ns, err := strconv.ParseInt(string(f[1]), 10, 64)
	if err != nil || ns < 0 {
		return 0, false
	}
	return time.Duration(ns), true
}
