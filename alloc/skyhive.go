package alloc

import (
	"context"
	"math"
	"math/rand/v2"
	"slices"
	"time"
)

// Skyhive is our network-aware strategy. It minimises the problem's
// objective under the full cost model (see Evaluate), including the
// latency and bandwidth of every stage-to-stage link, chooses the device
// order and may leave devices out.
//
// For a candidate device order it runs an exact dynamic program over
// (devices considered, layers covered, region of the last used device)
// that decides which devices to use and where the block boundaries go.
// For the sequential schedule (M = 1) the program minimises the iteration
// time exactly for that order. For the pipelined schedule, whose estimate
// adds (M−1)·max(stage, link) to a sum, the program minimises the sum
// under a cap C on every per-micro-batch stage and link time, for a
// geometric grid of caps refined around the best one; each plan is scored
// with the exact estimate. For the bottleneck objective it uses the exact
// fixed-order bisection.
//
// Candidate orders: the given order; devices grouped by region, regions in
// every permutation (up to 5 regions, otherwise greedily chained by the
// fastest links), fastest devices first within a region. A seeded local
// search then swaps devices in the best order. The plans of "even" and
// "sky" are scored too, so Skyhive is never worse than them under the
// objective.
type Skyhive struct {
	// Iterations of the order local search (default 200; negative: none).
	Iterations int
	// Caps is the number of caps on the grid for pipelined schedules
	// (default 24).
	Caps int
	// Seed seeds the local search.
	Seed uint64
	// ExactBudget bounds the free-order bottleneck search whose plan seeds
	// the candidate orders (default 200 ms; negative: skip it).
	ExactBudget time.Duration
}

// Name returns "skyhive".
func (Skyhive) Name() string { return "skyhive" }

type shSolver struct {
	in   *inst
	obj  Objective
	caps int
	// DP buffers
	cur, nxt []float64
	par      [][]int32 // per device position: packed parent per state
}

// Solve searches orders and plans.
func (s Skyhive) Solve(ctx context.Context, p Problem) (*Result, error) {
	start := time.Now()
	in, err := compileFitting(p)
	if err != nil {
		return nil, err
	}
	iters := s.Iterations
	if iters == 0 {
		iters = 200
	}
	caps := s.Caps
	if caps <= 0 {
		caps = 24
	}
	sv := &shSolver{in: in, obj: p.Objective, caps: caps}

	var best Plan
	bestV := math.Inf(1)
	bestCap := math.Inf(1)
	var bestOrder []int
	consider := func(pl Plan, order []int, c float64) {
		if len(pl.Stages) == 0 {
			return
		}
		v := sv.score(pl)
		if v < bestV {
			best, bestV, bestCap, bestOrder = pl, v, c, order
		}
	}
	for _, name := range []string{"even", "sky"} {
		st, _ := NewStrategy(name)
		if r, err := st.Solve(ctx, p); err == nil && r.Report.Feasible() {
			consider(r.Plan, nil, math.Inf(1))
		}
	}
	orders := candidateOrders(in)
	if budget := s.ExactBudget; budget >= 0 {
		if budget == 0 {
			budget = 200 * time.Millisecond
		}
		bctx, cancel := context.WithTimeout(ctx, budget)
		bp, _, _, _, err := minBottleneck(bctx, in)
		cancel()
		if err == nil {
			consider(bp, nil, math.Inf(1))
			orders = append(orders, orderOf(in, bp))
		}
	}
	for _, ord := range orders {
		pl, c := sv.solveOrder(ord, math.NaN())
		consider(pl, ord, c)
		if ctx.Err() != nil {
			break
		}
	}
	if bestOrder == nil && len(best.Stages) == 0 {
		// Every fixed order failed memory; fall back to a free-order search.
		pl, ok, err := coverDFS(ctx, in, math.Inf(1))
		if err != nil || !ok {
			return nil, fragmentationError(in)
		}
		consider(pl, nil, math.Inf(1))
	}
	if bestOrder != nil && iters > 0 && in.n > 1 {
		rng := rand.New(rand.NewPCG(s.Seed, 0x5eed))
		ord := slices.Clone(bestOrder)
		for it := 0; it < iters && ctx.Err() == nil; it++ {
			i, j := rng.IntN(in.n), rng.IntN(in.n)
			if i == j {
				continue
			}
			ord[i], ord[j] = ord[j], ord[i]
			pl, c := sv.solveOrder(ord, bestCap)
			if len(pl.Stages) > 0 && sv.score(pl) < bestV {
				consider(pl, slices.Clone(ord), c)
			} else {
				ord[i], ord[j] = ord[j], ord[i]
			}
		}
		// Re-run the full cap grid on the final order.
		pl, c := sv.solveOrder(bestOrder, math.NaN())
		consider(pl, bestOrder, c)
	}
	return finish(s.Name(), p, best, start)
}

// score is the objective value of a valid, memory-feasible plan.
func (sv *shSolver) score(pl Plan) float64 {
	r, err := Evaluate(sv.in.c, sv.in.m, pl)
	if err != nil || !r.Feasible() {
		return math.Inf(1)
	}
	return r.Value(sv.obj)
}

// candidateOrders returns the initial orders to try.
func candidateOrders(in *inst) [][]int {
	orders := [][]int{identityOrder(in.n)}
	R := len(in.links)
	byRegion := make([][]int, R)
	for _, d := range speedOrder(in, identityOrder(in.n)) {
		byRegion[in.reg[d]] = append(byRegion[in.reg[d]], d)
	}
	var perms [][]int
	if R <= 5 {
		perms = permutations(R)
	} else {
		for first := 0; first < R; first++ {
			perms = append(perms, chainRegions(in, first))
		}
	}
	for _, perm := range perms {
		var o []int
		for _, r := range perm {
			o = append(o, byRegion[r]...)
		}
		orders = append(orders, o)
	}
	return orders
}

// orderOf lists a plan's devices in stage order followed by the unused
// devices, fastest first.
func orderOf(in *inst, pl Plan) []int {
	used := make([]bool, in.n)
	var o []int
	for _, s := range pl.Stages {
		o = append(o, s.Device)
		used[s.Device] = true
	}
	for _, d := range speedOrder(in, identityOrder(in.n)) {
		if !used[d] {
			o = append(o, d)
		}
	}
	return o
}

func permutations(n int) [][]int {
	if n == 0 {
		return [][]int{{}}
	}
	var out [][]int
	for _, p := range permutations(n - 1) {
		for i := 0; i <= len(p); i++ {
			q := slices.Insert(slices.Clone(p), i, n-1)
			out = append(out, q)
		}
	}
	return out
}

// chainRegions orders regions greedily, each followed by the unvisited
// region with the highest bandwidth from it.
func chainRegions(in *inst, first int) []int {
	R := len(in.links)
	seen := make([]bool, R)
	out := []int{first}
	seen[first] = true
	for len(out) < R {
		last, pick := out[len(out)-1], -1
		for r := 0; r < R; r++ {
			if !seen[r] && (pick < 0 || bwOf(in.links[last][r]) > bwOf(in.links[last][pick])) {
				pick = r
			}
		}
		seen[pick] = true
		out = append(out, pick)
	}
	return out
}

func bwOf(l Link) float64 {
	if l.Bandwidth <= 0 {
		return math.Inf(1)
	}
	return l.Bandwidth
}

// solveOrder returns the best plan for a fixed order and the cap used. If
// cap is NaN the full cap grid is searched; otherwise only that cap.
func (sv *shSolver) solveOrder(order []int, cap float64) (Plan, float64) {
	in := sv.in
	if sv.obj == ObjBottleneck {
		pl, _, ok := bottleneckForOrder(in, order)
		if !ok {
			return Plan{}, 0
		}
		return pl, 0
	}
	if in.M == 1 {
		pl, _ := sv.dp(order, math.Inf(1))
		return pl, math.Inf(1)
	}
	if !math.IsNaN(cap) {
		pl, _ := sv.dp(order, cap)
		return pl, cap
	}
	// Pipelined: search caps. The smallest meaningful cap is this order's
	// per-micro-batch compute bottleneck; the largest is what the uncapped
	// program's plan needs.
	free, _ := sv.dp(order, math.Inf(1))
	if len(free.Stages) == 0 {
		return Plan{}, 0
	}
	best, bestC, bestV := free, math.Inf(1), sv.score(free)
	hi := sv.planCap(free)
	lo := hi
	if _, t, ok := bottleneckForOrder(in, order); ok {
		lo = t / float64(in.M)
	}
	if lo >= hi {
		return best, bestC
	}
	ratio := math.Pow(hi/lo, 1/float64(sv.caps-1))
	grid := make([]float64, sv.caps)
	for i := range grid {
		grid[i] = lo * math.Pow(ratio, float64(i))
	}
	bi := -1
	for i, c := range grid {
		pl, _ := sv.dp(order, c)
		if v := sv.score(pl); v < bestV {
			best, bestC, bestV, bi = pl, c, v, i
		}
	}
	if bi >= 0 { // refine between the neighbours of the best cap
		a, b := grid[max(bi-1, 0)], grid[min(bi+1, len(grid)-1)]
		for k := 1; k < 8; k++ {
			c := a * math.Pow(b/a, float64(k)/8)
			pl, _ := sv.dp(order, c)
			if v := sv.score(pl); v < bestV {
				best, bestC, bestV = pl, c, v
			}
		}
	}
	return best, bestC
}

// planCap is the largest per-micro-batch stage or link time of a plan.
func (sv *shSolver) planCap(pl Plan) float64 {
	in := sv.in
	M := float64(in.M)
	c := 0.0
	for k, s := range pl.Stages {
		c = math.Max(c, in.stageTime(s.Device, s.First, s.Last)/M)
		if k > 0 {
			l := in.links[in.reg[pl.Stages[k-1].Device]][in.reg[s.Device]]
			if l.Bandwidth > 0 {
				c = math.Max(c, in.out[s.First-1]/M/l.Bandwidth)
			}
		}
	}
	return c
}

// dp minimises Σ per-micro-batch stage times + Σ 2·(latency + per-micro-
// batch transfer) over plans using a subsequence of order, with every stage
// and link time at most c. It returns the plan and its sum (Inf if none).
func (sv *shSolver) dp(order []int, c float64) (Plan, float64) {
	in := sv.in
	L, R := in.L, len(in.links)
	W := R + 1 // state r+1, r=-1 means "no stage yet"
	ns := (L + 1) * W
	M := float64(in.M)
	if len(sv.cur) != ns {
		sv.cur = make([]float64, ns)
		sv.nxt = make([]float64, ns)
	}
	for len(sv.par) < len(order) {
		sv.par = append(sv.par, nil)
	}
	cur, nxt := sv.cur, sv.nxt
	inf := math.Inf(1)
	for i := range cur {
		cur[i] = inf
	}
	cur[0] = 0 // p=0, r=-1
	for j, d := range order {
		copy(nxt, cur)
		if len(sv.par[j]) != ns {
			sv.par[j] = make([]int32, ns)
		}
		par := sv.par[j]
		for i := range par {
			par[i] = -1 // skip
		}
		rd := in.reg[d]
		limW := c * M * in.speed[d]
		for p := 0; p < L; p++ {
			for r := -1; r < R; r++ {
				base := cur[p*W+r+1]
				if math.IsInf(base, 1) {
					continue
				}
				link := 0.0
				if r >= 0 {
					l := in.links[r][rd]
					s := 0.0
					if l.Bandwidth > 0 {
						s = in.out[p-1] / M / l.Bandwidth
					}
					if s > c*(1+1e-12) {
						continue
					}
					link = 2 * (l.Latency + s)
				}
				for q := p + 1; q <= L; q++ {
					w := in.work[q] - in.work[p]
					if w > limW*(1+1e-12) || !in.fits(d, p, q) {
						break
					}
					v := base + link + w/M/in.speed[d]
					si := q*W + rd + 1
					if v < nxt[si] {
						nxt[si] = v
						par[si] = int32(p*W + r + 1)
					}
				}
			}
		}
		cur, nxt = nxt, cur
	}
	sv.cur, sv.nxt = cur, nxt
	bestS, bestV := -1, inf
	for r := 0; r < R; r++ {
		if v := cur[L*W+r+1]; v < bestV {
			bestS, bestV = L*W+r+1, v
		}
	}
	if bestS < 0 {
		return Plan{}, inf
	}
	// Walk back through the parents.
	var st []Stage
	s := bestS
	for j := len(order) - 1; j >= 0 && s != 0; j-- {
		ps := sv.par[j][s]
		if ps < 0 {
			continue
		}
		st = append(st, Stage{Device: order[j], First: int(ps) / W, Last: s / W})
		s = int(ps)
	}
	slices.Reverse(st)
	return Plan{Stages: st}, bestV
}
