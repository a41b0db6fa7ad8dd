// Checks and robust aggregation of the contributions to a chunk: the norm
// check that drops contributions far larger than the group's median, and
// the aggregation rules a reducer can apply instead of the plain mean.

package averaging

import (
	"fmt"
	"math"
	"slices"

	"github.com/skyhive/skyhive/tensor"
)

// Aggregation names how a reducer combines the contributions to a chunk.
type Aggregation string

// Aggregation rules.
const (
	// AggregateMean is the plain mean (the default): exact, and what
	// honest runs want.
	AggregateMean Aggregation = "mean"
	// AggregateCenteredClip is CenteredClip (Karimireddy, He and Jaggi,
	// 2021, "Learning from history for Byzantine robust optimization"):
	// starting from the coordinate-wise median v, it repeats
	// v ← v + 1/n·Σ (xᵢ−v)·min(1, τ/‖xᵢ−v‖), so that no contribution
	// moves the result by more than τ/n per iteration. With every
	// contribution within τ of the mean it equals the mean.
	AggregateCenteredClip Aggregation = "centered-clip"
	// AggregateTrimmedMean is the coordinate-wise trimmed mean: for every
	// element the largest and smallest Config.Trim fraction of the values
	// (at least one of each with three or more contributions) are left out.
	AggregateTrimmedMean Aggregation = "trimmed-mean"
)

// ParseAggregation returns the aggregation named s ("" is the mean).
func ParseAggregation(s string) (Aggregation, error) {
	switch a := Aggregation(s); a {
	case "", AggregateMean:
		return AggregateMean, nil
	case AggregateCenteredClip, AggregateTrimmedMean:
		return a, nil
	}
	return "", fmt.Errorf("averaging: unknown aggregation %q (want mean, centered-clip or trimmed-mean)", s)
}

// Defaults of the contribution checks.
const (
	// DefaultMaxNormRatio: a contribution whose norm is above 100× the
	// median norm of the chunk's contributions (and above the reducer's
	// floor) is dropped. It stops absurd values, not a careful attacker
	// (CenteredClip does that). Honest gradients of small batches are
	// heavy-tailed: in 1,272 chunks of two peers' language-model gradients
	// (batches of 3×16 tokens) the larger norm was 1.15× the smaller at
	// the median, 11× at the 99th percentile and 61× at most; with 10×
	// (the default until 2026-11-26) 1.1% of honest chunks were dropped.
	DefaultMaxNormRatio = 100
	// DefaultTrim is the trimmed mean's fraction cut at each end.
	DefaultTrim = 0.2
	// DefaultClipIters bounds CenteredClip's iterations.
	DefaultClipIters = 20
)

// aggregator is a session's aggregation settings.
type aggregator struct {
	kind     Aggregation
	maxRatio float64 // 0: no norm check
	radius   float64 // CenteredClip's τ (0: adaptive)
	trim     float64
}

func (a *Averager) aggregator() aggregator {
	return aggregator{kind: a.cfg.Aggregation, maxRatio: max(a.cfg.MaxNormRatio, 0), radius: a.cfg.ClipRadius, trim: a.cfg.Trim}
}

// retain says whether contributions must be kept until finalization.
func (g aggregator) retain() bool { return g.maxRatio > 0 || g.kind != AggregateMean }

// aggregate turns c.sum into the chunk's aggregate: it drops the other
// members' contributions whose norm exceeds maxRatio times the median norm
// (this peer's own is trusted), then takes the mean or the robust
// aggregate of the rest. s.mu must be held.
func (s *session) aggregate(c *chunk) {
	if c.contrib == nil {
		tensor.Scale(1/float32(c.count), c.sum)
		return
	}
	defer func() {
		for _, p := range c.contrib {
			if p != nil {
				putScratch(p)
			}
		}
		c.contrib, c.own, c.norm = nil, nil, nil
	}()
	if g := s.agg.maxRatio; g > 0 {
		c.norm[s.self] = Norm(c.own)
		var norms []float64
		for j, ok := range c.from {
			if ok && (j == s.self || c.contrib[j] != nil) {
				norms = append(norms, c.norm[j])
			}
		}
		slices.Sort(norms)
		// The upper median, but with two members the smaller norm (either
		// could be the attacker; this peer's own is kept anyway).
		m := len(norms) / 2
		if len(norms) == 2 {
			m = 0
		}
		med := norms[m]
		for j, p := range c.contrib {
			if p == nil || j == s.self || c.norm[j] <= g*med {
				continue
			}
			// Over the median's bound: also over the floor's? (Computed
			// only here, so honest dense chunks never pay for it.)
			if ref := max(med, s.chunkFloor(len(c.own))); ref > 0 && c.norm[j] > g*ref {
				s.rejected[j] = true
				putScratch(p)
				c.contrib[j] = nil
			}
		}
	}
	xs := [][]float32{c.own}
	for _, p := range c.contrib {
		if p != nil {
			xs = append(xs, *p)
		}
	}
	c.count = len(xs)
	switch s.agg.kind {
	case AggregateCenteredClip:
		CenteredClip(c.sum, xs, s.agg.radius, DefaultClipIters)
	case AggregateTrimmedMean:
		TrimmedMean(c.sum, xs, s.agg.trim)
	default:
		if countTrue(c.from) == len(xs) {
			// Nothing dropped: the running sum is the exact sum.
			tensor.Scale(1/float32(c.count), c.sum)
			return
		}
		Mean(c.sum, xs)
	}
}

// chunkFloor is the RMS of this peer's part scaled to a chunk of n
// elements: the norm below which no contribution is too large, whatever
// the chunk's median. The part's values are this peer's own or, for
// chunks already final, their aggregate: either is of the scale honest
// members send. s.mu must be held.
func (s *session) chunkFloor(n int) float64 {
	if s.partRMS < 0 {
		s.partRMS = 0
		if len(s.ownPart) > 0 {
			s.partRMS = Norm(s.ownPart) / math.Sqrt(float64(len(s.ownPart)))
		}
	}
	return s.partRMS * math.Sqrt(float64(n))
}

func countTrue(b []bool) int {
	n := 0
	for _, x := range b {
		if x {
			n++
		}
	}
	return n
}

// Norm is the Euclidean norm of x, summed in float64 (tensor.SumSquares:
// eight partial sums, so the adds do not wait on each other; the
// contribution checks run it on every chunk). It is finite exactly when
// every value of x is.
func Norm(x []float32) float64 {
	return math.Sqrt(tensor.SumSquares(x))
}

// dist is ‖x−y‖.
func dist(x, y []float32) float64 {
	var s float64
	for i, v := range x {
		d := float64(v) - float64(y[i])
		s += d * d
	}
	return math.Sqrt(s)
}

// Mean writes the element-wise mean of xs (all of len(dst)) into dst.
func Mean(dst []float32, xs [][]float32) {
	copy(dst, xs[0])
	for _, x := range xs[1:] {
		tensor.Axpy(1, x, dst)
	}
	tensor.Scale(1/float32(len(xs)), dst)
}

// CoordinateMedian writes the element-wise median of xs into dst (the mean
// of the two middle values for an even count).
func CoordinateMedian(dst []float32, xs [][]float32) {
	n := len(xs)
	col := make([]float32, n)
	for k := range dst {
		for i, x := range xs {
			col[i] = x[k]
		}
		slices.Sort(col)
		if n%2 == 1 {
			dst[k] = col[n/2]
		} else {
			dst[k] = (col[n/2-1] + col[n/2]) / 2
		}
	}
}

// CenteredClip writes into dst the CenteredClip aggregate of xs (all of
// len(dst)) with clipping radius tau, at most iters iterations (see
// AggregateCenteredClip). A tau ≤ 0 is chosen as twice the median distance
// of the contributions from their coordinate-wise median: honest
// contributions, which are about equally far from it, are then not
// clipped and the result is their mean, while one far away is clipped to
// the others' scale.
func CenteredClip(dst []float32, xs [][]float32, tau float64, iters int) {
	n := len(xs)
	CoordinateMedian(dst, xs)
	d := make([]float64, n)
	if tau <= 0 {
		for i, x := range xs {
			d[i] = dist(x, dst)
		}
		s := slices.Clone(d)
		slices.Sort(s)
		tau = 2 * s[(n-1)/2]
	}
	step := make([]float64, len(dst))
	for range iters {
		clear(step)
		for _, x := range xs {
			dd := dist(x, dst)
			w := 1 / float64(n)
			if dd > tau {
				w *= tau / dd
			}
			if w == 0 {
				continue
			}
			for k, v := range x {
				step[k] += w * (float64(v) - float64(dst[k]))
			}
		}
		var moved, size float64
		for k, v := range step {
			dst[k] += float32(v)
			moved += v * v
			size += float64(dst[k]) * float64(dst[k])
		}
		if moved <= 1e-14*size || moved == 0 {
			return
		}
	}
}

// TrimmedMean writes into dst the coordinate-wise mean of xs without the
// trim fraction of largest and of smallest values (at least one of each
// when there are three or more, and always at least one value left).
func TrimmedMean(dst []float32, xs [][]float32, trim float64) {
	n := len(xs)
	b := int(trim * float64(n))
	if n >= 3 {
		b = max(b, 1)
	}
	b = min(b, (n-1)/2)
	col := make([]float32, n)
	for k := range dst {
		for i, x := range xs {
			col[i] = x[k]
		}
		slices.Sort(col)
		var s float64
		for _, v := range col[b : n-b] {
			s += float64(v)
		}
		dst[k] = float32(s / float64(n-2*b))
	}
}
