package pipeline

import (
	"fmt"
	"strings"
)

// Schedule is the order in which a stage runs the forward and backward
// passes of one iteration's micro-batches.
type Schedule int

const (
	// Sequential is the schedule of Sky Computing: the whole batch goes
	// forward stage by stage, then backward. It is GPipe with one
	// micro-batch; only one stage works at a time.
	Sequential Schedule = iota
	// GPipe runs every micro-batch forward, then every micro-batch
	// backward, accumulating gradients, then takes one optimizer step.
	GPipe
	// OneFOneB (PipeDream-flush) runs S−s−1 warm-up forwards on stage s,
	// then alternates one forward and one backward, then drains the
	// remaining backwards. It computes the same gradients as GPipe while
	// holding at most S−s micro-batches' activations.
	OneFOneB
)

// ParseSchedule parses "sequential", "gpipe" or "1f1b".
func ParseSchedule(s string) (Schedule, error) {
	switch strings.ToLower(s) {
	case "sequential", "seq":
		return Sequential, nil
	case "gpipe":
		return GPipe, nil
	case "1f1b", "onefoneb":
		return OneFOneB, nil
	}
	return 0, fmt.Errorf("pipeline: unknown schedule %q (want sequential, gpipe or 1f1b)", s)
}

// String names the schedule as ParseSchedule accepts it.
func (s Schedule) String() string {
	switch s {
	case Sequential:
		return "sequential"
	case GPipe:
		return "gpipe"
	case OneFOneB:
		return "1f1b"
	}
	return fmt.Sprintf("schedule(%d)", int(s))
}

// MarshalText implements encoding.TextMarshaler.
func (s Schedule) MarshalText() ([]byte, error) { return []byte(s.String()), nil }

// UnmarshalText implements encoding.TextUnmarshaler.
func (s *Schedule) UnmarshalText(b []byte) error {
	v, err := ParseSchedule(string(b))
	if err != nil {
		return err
	}
	*s = v
	return nil
}

// Micro returns the number of micro-batches the schedule uses when m are
// requested: 1 for Sequential, max(m, 1) otherwise.
func (s Schedule) Micro(m int) int {
	if s == Sequential || m < 1 {
		return 1
	}
	return m
}

// Op is one step of a stage's schedule: the forward or backward pass of
// one micro-batch.
type Op struct {
	Backward bool
	Micro    int
}

// String renders the op as F3 or B3.
func (o Op) String() string {
	if o.Backward {
		return fmt.Sprintf("B%d", o.Micro)
	}
	return fmt.Sprintf("F%d", o.Micro)
}

// Ops returns the ops stage (0-based) of stages runs in one iteration of m
// micro-batches (m is taken through Schedule.Micro). Every micro-batch
// appears once forward and once backward, forward first, and micro-batches
// go through each direction in ascending order, so gradients accumulate in
// the same order under every schedule.
func Ops(s Schedule, stage, stages, m int) []Op {
	m = s.Micro(m)
	ops := make([]Op, 0, 2*m)
	if s != OneFOneB {
		for i := range m {
			ops = append(ops, Op{Micro: i})
		}
		for i := range m {
			ops = append(ops, Op{Backward: true, Micro: i})
		}
		return ops
	}
	warm := min(max(stages-stage-1, 0), m)
	for i := range warm {
		ops = append(ops, Op{Micro: i})
	}
	for i := range m - warm {
		ops = append(ops, Op{Micro: warm + i}, Op{Backward: true, Micro: i})
	}
	for i := m - warm; i < m; i++ {
		ops = append(ops, Op{Backward: true, Micro: i})
	}
	return ops
}
