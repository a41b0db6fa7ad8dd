package alloc

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"time"
)

// DefaultOptimalTimeLimit bounds Optimal.Solve when no TimeLimit is set.
const DefaultOptimalTimeLimit = 10 * time.Second

// maxOptimalDevices is the largest cluster the branch and bound handles.
const maxOptimalDevices = 256

// Optimal solves the paper's MILP exactly: minimise the largest per-device
// compute time max_d (FLOPs_d / speed_d) such that every layer is on one
// device, each device holds a contiguous block of layers (possibly none)
// within its memory. As in the reference code (allocator.py,
// optimal_allocate), the pipeline order of the devices is free: the blocks
// are sorted by their first layer afterwards. The network is ignored.
//
// Algorithm: a search over the bottleneck value T (bisection on reals
// between a lower and an upper bound until they agree to 1e-9 relative),
// where each feasibility test "can the layers be covered within T?" is a
// depth-first branch and bound over device sequences: from layer p a device
// always takes the longest block it can (which is dominant), devices are
// tried longest reach first, failed (position, used set) states are
// memoised, identical devices are tried once, a device with the same reach
// as one it dominates (faster and larger) is not tried, and a node is cut
// when the unused devices' longest possible blocks cannot cover the rest.
// When the time limit interrupts a test, the best plan found is returned
// with Proven=false and the gap to the lower bound.
type Optimal struct {
	// TimeLimit bounds the solve (DefaultOptimalTimeLimit if zero).
	TimeLimit time.Duration
}

// Name returns "optimal".
func (Optimal) Name() string { return "optimal" }

var errDeadline = errors.New("alloc: time limit")

// Solve finds a plan minimising the bottleneck.
func (o Optimal) Solve(ctx context.Context, p Problem) (*Result, error) {
	start := time.Now()
	in, err := compile(p)
	if err != nil {
		return nil, err
	}
	if in.n > maxOptimalDevices {
		return nil, fmt.Errorf("alloc: optimal supports at most %d devices, got %d", maxOptimalDevices, in.n)
	}
	if err := checkMemory(p.Cluster, p.Model); err != nil {
		return nil, err
	}
	limit := o.TimeLimit
	if limit <= 0 {
		limit = DefaultOptimalTimeLimit
	}
	ctx, cancel := context.WithTimeout(ctx, limit)
	defer cancel()

	best, ub, lb, proven, err := minBottleneck(ctx, in)
	if err != nil {
		return nil, err
	}
	res, err := finish(o.Name(), p, best, start)
	if err != nil {
		return nil, err
	}
	res.Proven = proven
	res.LowerBound = lb
	res.Gap = (ub - res.LowerBound) / ub
	if !proven {
		res.Notes = append(res.Notes, fmt.Sprintf("time limit %v: bottleneck within %.2f%% of optimal", limit, 100*res.Gap))
	}
	return res, nil
}

// minBottleneck searches the smallest bottleneck over all device orders:
// bisection on T with coverDFS. It returns the best plan, its bottleneck,
// a proven lower bound and whether the plan is proven optimal (false when
// ctx expired first).
func minBottleneck(ctx context.Context, in *inst) (best Plan, ub, lb float64, proven bool, err error) {
	// Upper bound from fixed orders (given, fastest first).
	ub = math.Inf(1)
	for _, ord := range [][]int{identityOrder(in.n), speedOrder(in, identityOrder(in.n))} {
		if pl, t, ok := bottleneckForOrder(in, ord); ok && t < ub {
			best, ub = pl, t
		}
	}
	if math.IsInf(ub, 1) {
		pl, ok, err := coverDFS(ctx, in, math.Inf(1))
		if err != nil {
			return Plan{}, 0, 0, false, fmt.Errorf("alloc: searching a memory-feasible plan: %w", err)
		}
		if !ok {
			return Plan{}, 0, 0, false, fragmentationError(in)
		}
		best, ub = pl, planBottleneck(in, pl)
	}
	lb = bottleneckLowerBound(in)
	for ub-lb > 1e-9*ub {
		// Bisect while the gap is wide; then probe just below the incumbent,
		// so that one infeasible answer proves it optimal.
		t := (lb + ub) / 2
		if ub-lb < 1e-3*ub {
			t = ub * (1 - 1e-10)
		}
		pl, ok, err := coverDFS(ctx, in, t)
		if err != nil {
			return best, ub, lb, false, nil
		}
		if ok {
			best, ub = pl, planBottleneck(in, pl)
		} else {
			lb = t
		}
	}
	return best, ub, ub, true, nil
}

func identityOrder(n int) []int {
	o := make([]int, n)
	for i := range o {
		o[i] = i
	}
	return o
}

// speedOrder returns order sorted by decreasing speed (stable).
func speedOrder(in *inst, order []int) []int {
	o := slices.Clone(order)
	slices.SortStableFunc(o, func(a, b int) int {
		switch {
		case in.speed[a] > in.speed[b]:
			return -1
		case in.speed[a] < in.speed[b]:
			return 1
		}
		return 0
	})
	return o
}

// planBottleneck is the largest stage compute time of a plan.
func planBottleneck(in *inst, p Plan) float64 {
	t := 0.0
	for _, s := range p.Stages {
		t = math.Max(t, in.stageTime(s.Device, s.First, s.Last))
	}
	return t
}

// bottleneckLowerBound: all work spread over all speeds, and each layer on
// the fastest device that can hold it alone.
func bottleneckLowerBound(in *inst) float64 {
	var sp float64
	for _, s := range in.speed {
		sp += s
	}
	lb := in.work[in.L] / sp
	for i := 0; i < in.L; i++ {
		best := math.Inf(1)
		for d := 0; d < in.n; d++ {
			if in.fits(d, i, i+1) {
				best = math.Min(best, in.stageTime(d, i, i+1))
			}
		}
		lb = math.Max(lb, best)
	}
	return lb
}

// greedyCover covers layers with devices in the given order, each taking
// the longest block within t; it returns the partition bounds (len
// len(order)+1) and whether all layers are covered. It is exact for a
// fixed order: a longer prefix never hurts.
func greedyCover(in *inst, order []int, t float64) ([]int, bool) {
	b := make([]int, len(order)+1)
	p := 0
	for i, d := range order {
		if p < in.L {
			p = in.reach(d, p, t)
		}
		b[i+1] = p
	}
	return b, p == in.L
}

// bottleneckForOrder minimises the bottleneck for a fixed device order
// (devices may stay empty) by bisection with greedyCover.
func bottleneckForOrder(in *inst, order []int) (Plan, float64, bool) {
	b, ok := greedyCover(in, order, math.Inf(1))
	if !ok {
		return Plan{}, 0, false
	}
	best := planFromBounds(order, b)
	hi := planBottleneck(in, best)
	lo := bottleneckLowerBound(in)
	for hi-lo > 1e-9*hi {
		t := (lo + hi) / 2
		if b, ok := greedyCover(in, order, t); ok {
			best = planFromBounds(order, b)
			hi = planBottleneck(in, best)
		} else {
			lo = t
		}
	}
	return best, hi, true
}

type dfsKey struct {
	p    int32
	mask [maxOptimalDevices / 64]uint64
}

// coverDFS decides whether the layers can be covered by distinct devices
// in some order with every block within t (and within memory), returning
// a plan if so. It returns errDeadline when ctx expires.
func coverDFS(ctx context.Context, in *inst, t float64) (Plan, bool, error) {
	s := newCoverSearch(ctx, in, t)
	ok := s.rec(0)
	if s.timeout {
		return Plan{}, false, errDeadline
	}
	if !ok {
		return Plan{}, false, nil
	}
	return Plan{Stages: slices.Clone(s.path)}, true, nil
}

// coverSearch is coverDFS's depth-first search: its tables, the devices
// used so far (key.mask) and the states known to fail.
type coverSearch struct {
	ctx     context.Context
	in      *inst
	t       float64
	n, L    int
	reach   [][]int // reach[d][p]: the end of device d's longest block from layer p
	span    [][]int // span[d][p] = max_{q≥p} reach[d][q]-q
	class   []int   // class[d] is the smallest index of a device identical to d
	key     dfsKey
	failed  map[dfsKey]bool
	path    []Stage
	nodes   int
	timeout bool
}

// newCoverSearch builds the reach, span and class tables for bottleneck t.
func newCoverSearch(ctx context.Context, in *inst, t float64) *coverSearch {
	n, L := in.n, in.L
	s := &coverSearch{ctx: ctx, in: in, t: t, n: n, L: L, failed: map[dfsKey]bool{}}
	s.reach = make([][]int, n)
	s.span = make([][]int, n)
	for d := 0; d < n; d++ {
		s.reach[d] = make([]int, L+1)
		s.span[d] = make([]int, L+2)
		for p := L; p >= 0; p-- {
			s.reach[d][p] = in.reach(d, p, t)
			s.span[d][p] = max(s.span[d][p+1], s.reach[d][p]-p)
		}
	}
	s.class = make([]int, n)
	for d := range s.class {
		s.class[d] = d
		for e := 0; e < d; e++ {
			if in.speed[e] == in.speed[d] && in.cap[e] == in.cap[d] {
				s.class[d] = e
				break
			}
		}
	}
	return s
}

// dominates reports whether device a is at least as strong as b, not
// identical.
func (s *coverSearch) dominates(a, b int) bool {
	return s.in.speed[a] >= s.in.speed[b] && s.in.cap[a] >= s.in.cap[b] && s.class[a] != s.class[b]
}

// rec extends the path, which covers the layers before p, to cover the
// rest; it reports whether it did.
func (s *coverSearch) rec(p int) bool {
	if p == s.L {
		return true
	}
	s.nodes++
	if s.nodes&1023 == 0 && s.ctx.Err() != nil {
		s.timeout = true
	}
	if s.timeout {
		return false
	}
	s.key.p = int32(p)
	if s.failed[s.key] {
		return false
	}
	cands, ok := s.candidates(p)
	if !ok {
		s.failed[s.key] = true
		return false
	}
	reach := s.reach
	slices.SortStableFunc(cands, func(a, b int) int { return reach[b][p] - reach[a][p] })
	tried := map[int]bool{}
	for _, d := range cands {
		if tried[s.class[d]] || s.exchangeable(d, p, cands) {
			continue
		}
		tried[s.class[d]] = true
		r := reach[d][p]
		s.key.mask[d/64] |= 1 << (d % 64)
		s.path = append(s.path, Stage{Device: d, First: p, Last: r})
		if s.rec(r) {
			return true
		}
		s.path = s.path[:len(s.path)-1]
		s.key.mask[d/64] &^= 1 << (d % 64)
		s.key.p = int32(p)
		if s.timeout {
			return false
		}
	}
	if !s.timeout {
		s.failed[s.key] = true
	}
	return false
}

// candidates returns the unused devices whose block from layer p is not
// empty, or false when the bounds rule out covering the layers from p:
// the unused devices' longest blocks must cover the remaining layers,
// their speeds the remaining work within t and their memory the remaining
// layers' memory.
func (s *coverSearch) candidates(p int) ([]int, bool) {
	in := s.in
	cover := 0
	var speed float64
	var mem int64
	var cands []int
	for d := 0; d < s.n; d++ {
		if s.key.mask[d/64]&(1<<(d%64)) != 0 {
			continue
		}
		cover += s.span[d][p]
		speed += in.speed[d]
		mem += in.cap[d]
		if s.reach[d][p] > p {
			cands = append(cands, d)
		}
	}
	if cover < s.L-p || mem < in.mem[s.L]-in.mem[p] || in.work[s.L]-in.work[p] > s.t*speed*(1+1e-12) {
		return nil, false
	}
	return cands, true
}

// exchangeable reports whether device d need not be tried at layer p by
// the exchange argument: if a weaker device e reaches at least as far,
// using e now and keeping d for later is never worse.
func (s *coverSearch) exchangeable(d, p int, cands []int) bool {
	for _, e := range cands {
		if e != d && s.reach[e][p] >= s.reach[d][p] && s.dominates(d, e) {
			return true
		}
	}
	return false
}

// fragmentationError reports a cluster whose total memory suffices but on
// which no contiguous packing exists. Missing is what scaling every
// device's memory by the smallest sufficient factor (found by bisection,
// to 1%) would add.
func fragmentationError(in *inst) error {
	var have int64
	for _, c := range in.cap {
		have += c
	}
	need := in.mem[in.L]
	scaled := *in
	lo, hi := 1.0, 2.0
	ok := func(f float64) bool {
		scaled.cap = make([]int64, in.n)
		for d, c := range in.cap {
			scaled.cap[d] = int64(float64(c) * f)
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		_, found, err := coverDFS(ctx, &scaled, math.Inf(1))
		return err == nil && found
	}
	for !ok(hi) && hi < 64 {
		lo, hi = hi, hi*2
	}
	for hi/lo > 1.01 {
		mid := (lo + hi) / 2
		if ok(mid) {
			hi = mid
		} else {
			lo = mid
		}
	}
	return &MemoryError{Need: need, Have: have, Missing: int64(float64(have) * (hi - 1)),
		Detail: fmt.Sprintf("no contiguous packing of the layers fits (memory ×%.2f on every device would)", hi)}
}
