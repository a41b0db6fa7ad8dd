package pipeline

import (
	"runtime"
	"time"
)

// opClock measures one piece of compute: its wall time and the CPU time
// its thread consumed. The goroutine stays on its OS thread in between, so
// the thread CPU clock covers the op (single-threaded OpenBLAS and Go code
// run on the calling thread). Where the clock is unavailable CPU equals
// wall.
type opClock struct {
	wall time.Time
	cpu  time.Duration
	ok   bool
}

// startOp locks the goroutine to its thread and starts the clocks; the
// caller must call stop exactly once.
func startOp() opClock {
	runtime.LockOSThread()
	c, ok := threadCPU()
	return opClock{wall: time.Now(), cpu: c, ok: ok}
}

// stop unlocks the thread and returns the op's wall and CPU time.
func (o opClock) stop() (wall, cpu time.Duration) {
	c, ok := threadCPU()
	runtime.UnlockOSThread()
	wall = time.Since(o.wall)
	if !o.ok || !ok || c < o.cpu {
		return wall, wall
	}
	return wall, min(c-o.cpu, wall)
}
