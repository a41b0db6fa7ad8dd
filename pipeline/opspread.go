package pipeline

import "math"

// opKind groups the ops of a stage whose compute times should be alike:
// the same direction and micro-batch size.
type opKind struct {
	backward bool
	n        int
}

// opSpread accumulates the compute times of a stage's ops in one
// iteration, by kind, for their coefficient of variation. A stage has a
// few kinds (two directions, one or two micro-batch sizes), kept in the
// order first seen, so that cv sums them in a fixed order.
type opSpread struct {
	kinds []opMoments
}

// opMoments are the running count, sum and sum of squares of a kind's
// compute times.
type opMoments struct {
	kind      opKind
	n         int
	sum, sum2 float64
}

func (s *opSpread) add(k opKind, seconds float64) {
	i := 0
	for i < len(s.kinds) && s.kinds[i].kind != k {
		i++
	}
	if i == len(s.kinds) {
		s.kinds = append(s.kinds, opMoments{kind: k})
	}
	m := &s.kinds[i]
	m.n++
	m.sum += seconds
	m.sum2 += seconds * seconds
}

// cv returns the pooled coefficient of variation: the root mean square of
// every op's relative deviation from its kind's mean. Kinds of one op
// tell nothing and are left out; 0 without any other.
func (s *opSpread) cv() float64 {
	var sq float64
	n := 0
	for _, m := range s.kinds {
		if m.n < 2 || !(m.sum > 0) {
			continue
		}
		mean := m.sum / float64(m.n)
		// Σ(x−mean)² = Σx² − n·mean², relative to mean².
		v := (m.sum2 - float64(m.n)*mean*mean) / (mean * mean)
		sq += max(v, 0)
		n += m.n
	}
	if n == 0 {
		return 0
	}
	return math.Sqrt(sq / float64(n))
}
