package pipeline

import (
	"slices"
	"time"
)

// steadyWindow is how many recent executions of an op its steady busy time
// is the median of: one and a half iterations of the Sky Computing
// experiment's 32 micro-batches.
const steadyWindow = 48

// steadyWorks is how many stage assignments' histories a worker keeps, the
// least recently used forgotten first: enough for the plans a comparison
// alternates between (MeasurePlans) to find their ops' histories again.
const steadyWorks = 8

// stageWork names the work of a stage: the same layers of the same model
// in the same position compute the same ops whichever plan or generation
// assigned them.
type stageWork struct {
	model       string
	first, last int  // layers [first, last)
	input, head bool // the pipeline's first stage; its last (the loss)
}

// opKey names one kind of op of a stage: its work, direction and
// micro-batch size; commit marks the optimizer step.
type opKey struct {
	work     stageWork
	backward bool
	commit   bool
	n        int
}

// steadyCosts gives an emulated device a steady speed: the busy time its
// slowdown multiplies is the median of the op's recent executions rather
// than this execution's own. The busy time of identical work varies from
// second to second on a shared machine (stages of one plan measured ±17%
// apart on a 2-core VM, with one thread per worker); a real device of a
// given speed does not. Changes that last (a loaded host) still come
// through within half a window.
//
// Histories are kept per stage work, not per plan: a worker handed back
// layers it computed before (plans compared in turn) carries on with their
// history, so the first, colder executions after a switch (fresh buffers
// and optimizer state, up to 45% dearer here) do not fill the window and
// slow the device for the next two iterations. Not safe for concurrent
// use: the worker's runMu serialises ops.
type steadyCosts struct {
	hist map[opKey][]time.Duration // up to steadyWindow, oldest first
	used map[stageWork]uint64      // when each work last ran, by tick
	tick uint64
	buf  []time.Duration
}

// observe records an execution of op k that kept this machine busy for
// busy and returns the busy time to emulate: the median of the op's
// recent executions, this one included.
func (s *steadyCosts) observe(k opKey, busy time.Duration) time.Duration {
	if s.hist == nil {
		s.hist, s.used = map[opKey][]time.Duration{}, map[stageWork]uint64{}
	}
	s.tick++
	if _, ok := s.used[k.work]; !ok && len(s.used) == steadyWorks {
		s.forgetOldest()
	}
	s.used[k.work] = s.tick
	h := s.hist[k]
	if len(h) == steadyWindow {
		h = append(h[:0], h[1:]...)
	}
	h = append(h, busy)
	s.hist[k] = h
	return upperMedian(&s.buf, h)
}

// observeCold is observe for an execution in the first iteration of a
// freshly built stage (a plan switch), whose busy time is not the device's
// steady one: new buffers, gradients and optimizer state, and caches that
// other plans' layers filled. It returns the op's steady busy time without
// recording this one, unless the op has no history yet. Recording them
// filled half of a window at every switch back to a plan (a warm-up and a
// measured iteration per round), so a plan calibrated on warm iterations
// alone slowed through its rounds (4x24's even: 2.87 s at the end of its
// calibration, 3.06–3.13 s from its second round on).
func (s *steadyCosts) observeCold(k opKey, busy time.Duration) time.Duration {
	if len(s.hist[k]) == 0 {
		return s.observe(k, busy)
	}
	s.tick++
	s.used[k.work] = s.tick
	return upperMedian(&s.buf, s.hist[k])
}

// upperMedian returns the median of a non-empty xs, the upper of the two
// middle values for an even count, sorting a copy in *buf (reused, so that
// an op costs no allocation); xs is not modified.
func upperMedian(buf *[]time.Duration, xs []time.Duration) time.Duration {
	*buf = append((*buf)[:0], xs...)
	slices.Sort(*buf)
	return (*buf)[len(*buf)/2]
}

// forgetOldest drops the histories of the least recently used work.
func (s *steadyCosts) forgetOldest() {
	var oldest stageWork
	t := uint64(1<<64 - 1)
	for w, u := range s.used {
		if u < t {
			oldest, t = w, u
		}
	}
	delete(s.used, oldest)
	for k := range s.hist {
		if k.work == oldest {
			delete(s.hist, k)
		}
	}
}
