package optim

import "math"

// Decay selects how a Schedule decays after warm-up.
type Decay int

const (
	// Constant keeps the peak rate after warm-up.
	Constant Decay = iota
	// Linear decays linearly to Min at Total.
	Linear
	// Cosine decays along a half cosine to Min at Total.
	Cosine
)

// Schedule is a learning-rate schedule: linear warm-up from 0 to Peak over
// Warmup steps, then Constant, Linear or Cosine decay to Min at step Total
// (and Min afterwards). It is a pure function of the step, so every process
// of a distributed run computes the same rate.
type Schedule struct {
	Peak, Min     float64
	Warmup, Total int64
	Decay         Decay
}

// LR returns the learning rate for step (counting from 0).
func (s Schedule) LR(step int64) float64 {
	if step < s.Warmup {
		return s.Peak * float64(step+1) / float64(s.Warmup)
	}
	if s.Decay == Constant {
		return s.Peak
	}
	if step >= s.Total || s.Total <= s.Warmup {
		return s.Min
	}
	frac := float64(step-s.Warmup) / float64(s.Total-s.Warmup)
	switch s.Decay {
	case Linear:
		return s.Min + (s.Peak-s.Min)*(1-frac)
	default:
		return s.Min + (s.Peak-s.Min)*0.5*(1+math.Cos(math.Pi*frac))
	}
}
