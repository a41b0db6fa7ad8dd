package chart

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"sort"
)

// MedianBand summarizes runs of one thing (e.g. an algorithm under
// several seeds) as one series named name: Y is the median over the runs,
// Lo and Hi their minimum and maximum, drawn as a line in a band from the
// lowest to the highest run. Each run's X must not decrease; between its
// points a run is interpolated linearly. The series covers the x range
// that every run covers, with a point at every x where a run has one.
func MedianBand(name string, runs []Series) (Series, error) {
	if len(runs) == 0 {
		return Series{}, errors.New("chart: no runs for a median band")
	}
	lo, hi := math.Inf(-1), math.Inf(1)
	var xs []float64
	for _, r := range runs {
		if len(r.X) == 0 || len(r.X) != len(r.Y) {
			return Series{}, fmt.Errorf("chart: run %q has %d x and %d y values", r.Name, len(r.X), len(r.Y))
		}
		if !sort.Float64sAreSorted(r.X) {
			return Series{}, fmt.Errorf("chart: run %q: x values decrease", r.Name)
		}
		lo, hi = max(lo, r.X[0]), min(hi, r.X[len(r.X)-1])
		xs = append(xs, r.X...)
	}
	if lo > hi {
		return Series{}, fmt.Errorf("chart: runs of %q share no x range", name)
	}
	slices.Sort(xs)
	s := Series{Name: name}
	ys := make([]float64, len(runs))
	for _, x := range slices.Compact(xs) {
		if x < lo || x > hi {
			continue
		}
		for i, r := range runs {
			ys[i] = interpolate(r, x)
		}
		slices.Sort(ys)
		med := ys[len(ys)/2]
		if len(ys)%2 == 0 {
			med = (ys[len(ys)/2-1] + med) / 2
		}
		s.X, s.Y = append(s.X, x), append(s.Y, med)
		s.Lo, s.Hi = append(s.Lo, ys[0]), append(s.Hi, ys[len(ys)-1])
	}
	return s, nil
}

// interpolate is r's value at x, within r's x range: the last point's
// value at an x that several points share.
func interpolate(r Series, x float64) float64 {
	i := sort.SearchFloat64s(r.X, x) // first X[i] >= x
	if i == len(r.X) {
		return r.Y[len(r.Y)-1]
	}
	if r.X[i] == x || i == 0 {
		for i+1 < len(r.X) && r.X[i+1] == x {
			i++
		}
		return r.Y[i]
	}
	a, b := i-1, i
	return r.Y[a] + (r.Y[b]-r.Y[a])*(x-r.X[a])/(r.X[b]-r.X[a])
}
