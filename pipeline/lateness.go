package pipeline

import "time"

// latenessWindow is how many recent sleeps a steady device's lateness is
// the median of.
const latenessWindow = 32

// lateness tracks how late an emulated device's sleeps end: a thread woken
// from a timer waits for a core, the longer the more processes share the
// host's cores. A device of slowdown F takes F·busy for an op whatever else
// runs on the host, so a steady device (WorkerConfig.Steady) asks for its
// sleeps to end early by the median of its recent overshoots: without
// that, plans that keep more stages computing at once (balanced ones, on a
// host with fewer cores than workers) ran their ops 5–7% longer than their
// slowdowns (8 workers on 2 cores), and the calibration on the even plan
// did not see it. Not safe for concurrent use: the worker's runMu
// serialises ops.
type lateness struct {
	hist []time.Duration // up to latenessWindow, oldest first
	buf  []time.Duration
}

// aim returns the sleep to ask for so that a sleep of want ends on time:
// want less the median recent overshoot, at least half of want.
func (l *lateness) aim(want time.Duration) time.Duration {
	if len(l.hist) == 0 || want <= 0 {
		return want
	}
	return max(want-upperMedian(&l.buf, l.hist), want/2)
}

// observe records that a sleep asked for asked ended after slept.
func (l *lateness) observe(asked, slept time.Duration) {
	if asked <= 0 {
		return
	}
	if len(l.hist) == latenessWindow {
		l.hist = append(l.hist[:0], l.hist[1:]...)
	}
	l.hist = append(l.hist, max(slept-asked, 0))
}
