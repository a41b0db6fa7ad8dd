package pipeline

import (
	"slices"
	"time"
)

// steadyWindow is how many recent executions of an op its steady busy time
// is the median of: three iterations of 16 micro-batches.
const steadyWindow = 48

// opKey names one kind of op of a stage: its generation (the stage's
// layers), direction and micro-batch size; commit marks the optimizer step.
type opKey struct {
	gen      uint64
	backward bool
	commit   bool
	n        int
}

// steadyCosts gives an emulated device a steady speed: the busy time its
// slowdown multiplies is the median of the op's recent executions rather
// than this execution's own. The busy time of identical work varies from
// second to second on a shared machine (stages of one plan measured ±17%
// apart on a 2-core VM, with one thread per worker); a real device of a
// given speed does not. Changes that last (another plan, a loaded host)
// still come through within a window. Not safe for concurrent use: the
// worker's runMu serialises ops.
type steadyCosts struct {
	gen  uint64
	hist map[opKey][]time.Duration // up to steadyWindow, oldest first
	buf  []time.Duration
}

// observe records an execution of op k that kept this machine busy for
// busy and returns the busy time to emulate: the median of the op's
// recent executions, this one included. A new generation forgets the
// previous one's ops.
func (s *steadyCosts) observe(k opKey, busy time.Duration) time.Duration {
	if s.hist == nil || k.gen != s.gen {
		s.gen, s.hist = k.gen, map[opKey][]time.Duration{}
	}
	h := s.hist[k]
	if len(h) == steadyWindow {
		h = append(h[:0], h[1:]...)
	}
	h = append(h, busy)
	s.hist[k] = h
	s.buf = append(s.buf[:0], h...)
	slices.Sort(s.buf)
	return s.buf[len(s.buf)/2]
}
