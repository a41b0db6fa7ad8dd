package chart

import (
	"math"
	"strconv"

	"gonum.org/v1/plot"
)

// niceTicks marks an axis at round steps (1, 2 or 5 times a power of
// ten) with at most max labelled ticks, labelled with as many decimals as
// the step needs and no more (25, not 25.00), and an unlabelled tick
// half-way between. With integer set the step is at least 1, for axes
// whose values are whole numbers (layers, workers).
type niceTicks struct {
	max     int
	integer bool
}

// Ticks returns the ticks between lo and hi.
func (t niceTicks) Ticks(lo, hi float64) []plot.Tick {
	step := niceStep((hi - lo) / float64(max(t.max, 1)))
	if t.integer {
		step = max(step, 1)
	}
	dec := decimals(step)
	eps := step * 1e-9
	// An integer count bounds the loop where k*step cannot tell k from
	// k+1 (huge values, tiny range).
	first := math.Ceil(lo/step - 0.5)
	n := min(int((hi-lo)/step)+2, 4*max(t.max, 1)+4)
	var ticks []plot.Tick
	last := math.Inf(-1)
	for i := range n {
		v := (first + float64(i)) * step
		if v == last {
			continue
		}
		last = v
		if m := v - step/2; m >= lo-eps && m <= hi+eps {
			ticks = append(ticks, plot.Tick{Value: m})
		}
		if v >= lo-eps && v <= hi+eps {
			ticks = append(ticks, plot.Tick{Value: v, Label: formatTick(v, dec)})
		}
	}
	return ticks
}

// niceStep is the smallest of 1, 2 and 5 times a power of ten that is at
// least raw (1 for a raw step that is not a positive number).
func niceStep(raw float64) float64 {
	if !(raw > 0) || math.IsInf(raw, 0) {
		return 1
	}
	p := math.Pow(10, math.Floor(math.Log10(raw)))
	for _, m := range []float64{1, 2, 5} {
		if m*p >= raw*(1-1e-9) {
			return m * p
		}
	}
	return 10 * p
}

// decimals is the number of decimals that tell apart the multiples of a
// step of 1, 2 or 5 times a power of ten: 0 for 1 and above, 1 for 0.5.
func decimals(step float64) int {
	return max(0, -int(math.Floor(math.Log10(step)+1e-9)))
}

// formatTick writes v with dec decimals, without a minus sign on zero.
func formatTick(v float64, dec int) string {
	s := strconv.FormatFloat(v, 'f', dec, 64)
	if z := strconv.FormatFloat(0, 'f', dec, 64); s == "-"+z {
		return z
	}
	return s
}

// integers reports whether every value is a whole number.
func integers(vs ...[]float64) bool {
	for _, v := range vs {
		for _, x := range v {
			if x != math.Trunc(x) {
				return false
			}
		}
	}
	return true
}
