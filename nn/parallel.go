package nn

import (
	"runtime"
	"sync"
)

// parallelFor splits [0, n) into at most GOMAXPROCS contiguous chunks of at
// least grain items and calls fn on each chunk concurrently, returning when
// all are done. Small inputs run inline. fn must only write to memory that
// belongs to its own chunk.
func parallelFor(n, grain int, fn func(lo, hi int)) {
	workers := min(runtime.GOMAXPROCS(0), n/max(grain, 1))
	if workers <= 1 {
		fn(0, n)
		return
	}
	var wg sync.WaitGroup
	chunk := (n + workers - 1) / workers
	for lo := chunk; lo < n; lo += chunk {
		wg.Go(func() { fn(lo, min(lo+chunk, n)) })
	}
	fn(0, min(chunk, n))
	wg.Wait()
}

// rowGrain returns how many rows of the given width are worth a goroutine.
func rowGrain(cols int) int { return max(1, elemGrain/max(cols, 1)) }
