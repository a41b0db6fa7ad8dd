// Package stats summarises repeated measurements: the median (robust to the
// noise of shared machines), minimum and maximum. Benchmarks, profiles and
// link measurements use it.
package stats

import (
	"cmp"
	"slices"
)

// Summary is the median, minimum and maximum of some measurements.
type Summary[T cmp.Ordered] struct{ Median, Min, Max T }

// Number is what Summarize accepts: floats, integers and time.Duration.
type Number interface {
	~float32 | ~float64 | ~int | ~int32 | ~int64 | ~uint64
}

// Summarize returns the median, minimum and maximum of xs (zero for an
// empty xs). The median of an even count is the mean of the two middle
// values (+Inf when either is +Inf). xs is not modified.
func Summarize[T Number](xs []T) Summary[T] {
	if len(xs) == 0 {
		return Summary[T]{}
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	n := len(s)
	med := s[n/2]
	if n%2 == 0 && s[n/2-1] != s[n/2] {
		// Equal middle values are the median as they are (two +Inf
		// would give NaN below).
		med = s[n/2-1] + (s[n/2]-s[n/2-1])/2
	}
	return Summary[T]{Median: med, Min: s[0], Max: s[n-1]}
}

// Median returns the median of xs (zero for an empty xs).
func Median[T Number](xs []T) T { return Summarize(xs).Median }
