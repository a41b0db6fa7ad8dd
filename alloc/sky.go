package alloc

import (
	"context"
	"slices"
	"time"
)

// skyBreakIter is the paper's iteration cap for phase 2 (break_iter).
const skyBreakIter = 1000

// Sky is the paper's two-phase heuristic ("dynamic" allocation in
// hpcaitech/SkyComputing, scaelum/dynamics/allocator.py), over the devices
// in their given order, starting from the even partition:
//
//   - phase 1 (allocate by memory) sweeps the boundaries left to right:
//     a device over its memory gives its last layers to the next device,
//     then a device with spare memory takes layers from the next one while
//     they fit, until every device fits or nothing changes;
//   - phase 2 (allocate by FLOPs × time) repeatedly compares each device's
//     normalised workload (FLOPs × time per FLOP relative to the fastest
//     device) with the average: an under-loaded device takes the first
//     layer of the next device if its memory allows; an over-loaded device
//     whose next device is under-loaded gives its last layer away if it
//     stays above the average and the next device's memory allows; at most
//     1000 sweeps.
//
// Deviations: the original compares the next device's workload using the
// current device's layers (a bug that disables the "give away" move);
// Sky{} uses the next device's own workload, Sky{Original: true} keeps the
// bug. Memory tests use ≤ where the original mixes < and ≤. With fewer
// layers than devices only the first L devices are used. Where the
// original raises "memory allocation failed", Solve returns a *MemoryError
// with the amount still over memory.
type Sky struct {
	// Original reproduces the reference code's phase-2 comparison bug.
	Original bool
}

// Name returns "sky" or "sky-orig".
func (s Sky) Name() string {
	if s.Original {
		return "sky-orig"
	}
	return "sky"
}

// Solve runs the two phases.
func (s Sky) Solve(_ context.Context, p Problem) (*Result, error) {
	start := time.Now()
	in, err := compileFitting(p)
	if err != nil {
		return nil, err
	}
	n := min(in.n, in.L)
	order := make([]int, n)
	for i := range order {
		order[i] = i
	}
	idx := evenBounds(n, in.L)
	if over := skyPhase1(in, idx); over > 0 {
		var need int64
		var have int64
		for _, c := range in.cap[:n] {
			have += c
		}
		need = in.mem[in.L]
		return nil, &MemoryError{Need: need, Have: have, Missing: over,
			Detail: "sky's phase 1 could not fit the layers on the devices in their given order"}
	}
	s.phase2(in, idx)
	return finish(s.Name(), p, planFromBounds(order, idx), start)
}

// skyPhase1 moves boundaries until each device i (device index i) fits;
// it returns the total memory still over capacity (0 on success).
func skyPhase1(in *inst, idx []int) int64 {
	n := len(idx) - 1
	memOf := func(j int) int64 { return in.mem[idx[j+1]] - in.mem[idx[j]] }
	allFit := func() bool {
		for j := 0; j < n; j++ {
			if memOf(j) > in.cap[j] {
				return false
			}
		}
		return true
	}
	for sweep := 0; !allFit(); sweep++ {
		if sweep > in.L*n+10 { // the reference loops until nothing changes; guard against cycles
			break
		}
		old := slices.Clone(idx)
		done := false
		for j := 0; j < n-1 && !done; j++ {
			for memOf(j) > in.cap[j] && idx[j+1]-idx[j] > 1 {
				idx[j+1]--
				if allFit() {
					done = true
					break
				}
			}
			if done {
				break
			}
			for memOf(j) < in.cap[j] && idx[j+2]-idx[j+1] > 1 {
				if in.mem[idx[j+1]+1]-in.mem[idx[j]] > in.cap[j] {
					break
				}
				idx[j+1]++
				if allFit() {
					done = true
					break
				}
			}
		}
		if done {
			return 0
		}
		if slices.Equal(old, idx) {
			break
		}
	}
	var over int64
	for j := 0; j < n; j++ {
		over += max(0, memOf(j)-in.cap[j])
	}
	return over
}

func (s Sky) phase2(in *inst, idx []int) {
	n := len(idx) - 1
	minT := 0.0
	for j := 0; j < n; j++ {
		if t := 1 / in.speed[j]; minT == 0 || t < minT {
			minT = t
		}
	}
	wt := make([]float64, n) // normalised time per FLOP
	for j := range wt {
		wt[j] = (1 / in.speed[j]) / minT
	}
	flops := func(j int) float64 { return in.work[idx[j+1]] - in.work[idx[j]] }
	size := func(j int) int { return idx[j+1] - idx[j] }
	for iter := 0; iter < skyBreakIter; iter++ {
		total := 0.0
		for j := 0; j < n; j++ {
			total += flops(j) * wt[j]
		}
		target := total / float64(n)
		old := slices.Clone(idx)
		for j := 0; j < n-1; j++ {
			cur := flops(j) * wt[j]
			if cur < target && size(j+1) > 1 {
				if in.mem[idx[j+1]+1]-in.mem[idx[j]] <= in.cap[j] {
					idx[j+1]++
				}
				continue
			}
			last := (in.work[idx[j+1]] - in.work[idx[j+1]-1]) * wt[j]
			next := flops(j+1) * wt[j+1]
			if s.Original {
				next = flops(j) * wt[j]
			}
			if next < target && cur > target+last && size(j) > 1 {
				if in.mem[idx[j+2]]-in.mem[idx[j+1]-1] <= in.cap[j+1] {
					idx[j+1]--
				}
			}
		}
		if slices.Equal(old, idx) {
			break
		}
	}
}
