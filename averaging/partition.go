package averaging

import (
	"errors"
	"fmt"
	"math"
)

// Partition splits a vector of total elements into len(weights) contiguous
// parts whose sizes are proportional to the weights (DeDLOC-style
// bandwidth-aware splitting: a member's share of the reduce-scatter grows
// with its bandwidth). It returns len(weights)+1 bounds: part i is
// [bounds[i], bounds[i+1]). Sizes are rounded by the largest-remainder
// method, so they sum to total and every peer computes the same split.
// A zero weight gives an empty part (a member that only contributes, like a
// client behind a slow uplink). Negative or non-finite weights, or weights
// that are all zero, are errors.
func Partition(total int, weights []float64) ([]int, error) {
	if total < 0 {
		return nil, fmt.Errorf("averaging: negative vector length %d", total)
	}
	if len(weights) == 0 {
		return nil, errors.New("averaging: no members to partition among")
	}
	var sum float64
	for i, w := range weights {
		if w < 0 || math.IsNaN(w) || math.IsInf(w, 0) {
			return nil, fmt.Errorf("averaging: weight %d is %v, want a finite non-negative number", i, w)
		}
		sum += w
	}
	if sum == 0 {
		return nil, errors.New("averaging: all weights are zero")
	}
	sizes := make([]int, len(weights))
	rem := make([]float64, len(weights))
	assigned := 0
	for i, w := range weights {
		exact := float64(total) * w / sum
		sizes[i] = int(math.Floor(exact))
		rem[i] = exact - float64(sizes[i])
		assigned += sizes[i]
	}
	// Hand out the remaining elements to the largest remainders, ties to
	// the lower index, among members with a positive weight.
	for left := total - assigned; left > 0; left-- {
		best := -1
		for i := range rem {
			if weights[i] > 0 && (best < 0 || rem[i] > rem[best]) {
				best = i
			}
		}
		sizes[best]++
		rem[best] = -1
	}
	bounds := make([]int, len(weights)+1)
	for i, s := range sizes {
		bounds[i+1] = bounds[i] + s
	}
	return bounds, nil
}

// numChunks is the number of chunks of at most chunk elements in n elements.
func numChunks(n, chunk int) int {
	return (n + chunk - 1) / chunk
}

// DefaultGroupSize is WAGMA's default group size for p peers: the integer
// nearest √p, at least 2 (and at most p).
func DefaultGroupSize(p int) int {
	s := int(math.Round(math.Sqrt(float64(p))))
	return min(max(s, 2), max(p, 1))
}

// Windows is the number of digit windows of the butterfly schedule for p
// ranks in groups of s: the number of base-s digits of p-1, at least 1.
func Windows(p, s int) int {
	if s < 2 || p <= s {
		return 1
	}
	w := 0
	for x := p - 1; x > 0; x /= s {
		w++
	}
	return w
}

// ButterflyGroup returns the ranks in rank's group at the given round of
// WAGMA's butterfly schedule over p ranks with group size s. Ranks are
// written in base s; at round t the window is digit t mod Windows(p, s), and
// the group is every rank below p that agrees with rank on all other digits
// (for s a power of two the digits are the bit windows of the paper). When p
// is not a power of s some groups are smaller. The result is sorted and
// contains rank. It also returns the group's index, the rank with the window
// digit cleared, which names the group uniquely within the round.
func ButterflyGroup(rank, p, s, round int) (members []int, index int, err error) {
	if p < 1 || rank < 0 || rank >= p {
		return nil, 0, fmt.Errorf("averaging: rank %d out of range for %d peers", rank, p)
	}
	if s < 2 {
		return nil, 0, fmt.Errorf("averaging: group size %d, want at least 2", s)
	}
	if round < 0 {
		return nil, 0, fmt.Errorf("averaging: negative round %d", round)
	}
	if s >= p {
		all := make([]int, p)
		for i := range all {
			all[i] = i
		}
		return all, 0, nil
	}
	w := round % Windows(p, s)
	place := 1
	for range w {
		place *= s
	}
	digit := (rank / place) % s
	base := rank - digit*place
	for d := range s {
		r := base + d*place
		if r < p {
			members = append(members, r)
		}
	}
	return members, base, nil
}
