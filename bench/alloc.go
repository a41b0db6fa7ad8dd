package bench

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/skyhive/skyhive/alloc"
)

// Scenario constants of the alloc suite.
const (
	allocBaseSpeed = 10e12 // effective FLOP/s of an unslowed device
	allocBatch     = 32    // BERT-large batch per iteration
	allocMicro     = 32    // micro-batches of the pipelined schedule
)

func allocSuite() Suite {
	return Suite{
		Name:  "alloc",
		Short: "predicted iteration time per allocation strategy vs even; solve time; gap to the proven optimum",
		Run:   runAlloc,
	}
}

// allocProblem draws a seeded BERT-large scenario: n devices with speed
// base/U[1,6], memory caps ⌈L/n⌉·layer memory·U[max(lo,1.05),hi], except
// that in half the seeds a tenth of the devices get ⌊L/n⌋·layer
// memory·U[lo,0.95] (so some even splits do not fit; caps are scaled up if
// the total is below 1.15× the model), in regions regions given in
// shuffled order. Links inside a
// region: 0.2 ms, 10 Gbit/s; between regions 50–150 ms and 10–100 Mbit/s.
func allocProblem(seed uint64, cs allocCase, micro int) alloc.Problem {
	n, L, regions := cs.n, cs.L, cs.regions
	rng := rand.New(rand.NewPCG(seed, uint64(n*1000+L)))
	m := alloc.BertLarge(allocBatch).Model(fmt.Sprintf("bert-large:%d", L), L)
	m.MicroBatches = micro
	layerMem := m.Layers[0].MemBytes()
	c := &alloc.Cluster{Intra: alloc.Link{Latency: 0.2e-3, Bandwidth: 10e9 / 8}}
	names := []string{"eu", "us", "asia", "au"}
	for a := 0; a < regions; a++ {
		for b := a + 1; b < regions; b++ {
			c.RegionLinks = append(c.RegionLinks, alloc.RegionLink{A: names[a], B: names[b], Link: alloc.Link{
				Latency:   (50 + 100*rng.Float64()) * 1e-3,
				Bandwidth: (10 + 90*rng.Float64()) * 1e6 / 8,
			}})
		}
	}
	// Half the seeds leave every device room for the largest even share
	// (⌈L/n⌉ layers); in the other half a tenth of the devices (at least
	// one) cannot hold even the smallest (⌊L/n⌋ layers, at least one), so
	// the even split does not fit.
	evenMax := float64(layerMem) * float64((L+n-1)/n)
	evenMin := float64(layerMem) * float64(max(1, L/n))
	short := map[int]bool{}
	if rng.IntN(2) == 0 {
		for _, i := range rng.Perm(n)[:max(1, n/10)] {
			short[i] = true
		}
	}
	var total int64
	for i := 0; i < n; i++ {
		c0, lo, hi := evenMax, max(cs.memLo, 1.05), cs.memHi
		if short[i] {
			c0, lo, hi = evenMin, cs.memLo, 0.95
		}
		d := alloc.Device{
			Name:     fmt.Sprintf("w%02d", i),
			Speed:    allocBaseSpeed / (1 + 5*rng.Float64()),
			MemBytes: int64(c0 * (lo + (hi-lo)*rng.Float64())),
			Region:   names[rng.IntN(regions)],
		}
		total += d.MemBytes
		c.Devices = append(c.Devices, d)
	}
	if need := int64(1.15 * float64(layerMem) * float64(L)); total < need {
		for i := range c.Devices {
			c.Devices[i].MemBytes = int64(float64(c.Devices[i].MemBytes) * float64(need) / float64(total))
		}
	}
	return alloc.Problem{Cluster: c, Model: m}
}

type allocCase struct {
	n, L, regions int
	// memLo and memHi bound the memory cap as a multiple of the even share.
	memLo, memHi float64
	tag          string
}

// Memory regimes: "roomy" caps average 2.25× the even share, "tight" ones
// 1.6× (then most of the cluster's memory is needed).
const (
	roomyLo, roomyHi = 0.5, 4.0
	tightLo, tightHi = 0.75, 2.5
)

func runAlloc(ctx context.Context, o Options) ([]Result, error) {
	cases, netCases, seeds := allocCases(o.Quick)
	strategies := []string{"sky", "optimal", "skyhive"}
	schedules := []allocSchedule{{"seq", 1}, {fmt.Sprintf("gpipe%d", allocMicro), allocMicro}}
	strats, err := alloc.Strategies(strategies, 5*time.Second)
	if err != nil {
		return nil, err
	}
	r := &allocRun{o: o, ctx: ctx, strategies: strategies, strats: strats, seeds: seeds}
	var out []Result
	for _, cs := range append(cases, netCases...) {
		if err := ctx.Err(); err != nil {
			return nil, fmt.Errorf("alloc: %w", err)
		}
		net := cs.regions > 1
		label := fmt.Sprintf("%dx%d%s", cs.n, cs.L, cs.tag)
		if net {
			label = fmt.Sprintf("net%dr-%dx%d", cs.regions, cs.n, cs.L)
		}
		solveMs := map[string][]float64{}
		for _, sc := range schedules {
			res, err := r.schedule(cs, label, sc, solveMs)
			if err != nil {
				return nil, err
			}
			out = append(out, res...)
		}
		for _, name := range strategies {
			st := Summarize(solveMs[name])
			out = append(out, Result{Suite: "alloc", Case: label, Metric: "solve " + name, Value: st.Median, Unit: "ms", Min: st.Min, Max: st.Max})
		}
		if net {
			continue
		}
		res, err := r.bottleneck(cs, label)
		if err != nil {
			return nil, err
		}
		out = append(out, res)
	}
	return out, nil
}

// allocCases returns the single-region and the multi-region cases and
// the number of seeds each runs.
func allocCases(quick bool) (cases, netCases []allocCase, seeds int) {
	seeds = 10
	for _, n := range []int{16, 32, 64} {
		for _, L := range []int{40, 80, 160} {
			cases = append(cases, allocCase{n, L, 1, roomyLo, roomyHi, ""})
		}
	}
	cases = append(cases, allocCase{64, 160, 1, tightLo, tightHi, "-tight"})
	netCases = []allocCase{{32, 80, 2, roomyLo, roomyHi, ""}, {64, 160, 3, roomyLo, roomyHi, ""}}
	if quick {
		seeds = 5
		cases = []allocCase{{16, 40, 1, roomyLo, roomyHi, ""}, {64, 160, 1, roomyLo, roomyHi, ""}}
		netCases = netCases[:1]
	}
	return cases, netCases, seeds
}

// allocSchedule is a pipeline schedule the cases are solved for.
type allocSchedule struct {
	name  string
	micro int
}

// allocRun is what every case of the alloc suite shares.
type allocRun struct {
	o          Options
	ctx        context.Context
	strategies []string
	strats     []alloc.Strategy
	seeds      int
}

// allocTally is what schedule gathers over the seeds of one case.
type allocTally struct {
	ratios   map[string][]float64
	failed   map[string]int
	evenOver int
	worse    int
}

// schedule compares the strategies on every seed of case cs under
// schedule sc and returns their speedups on the even split; it appends
// each strategy's solve times to solveMs.
func (r *allocRun) schedule(cs allocCase, label string, sc allocSchedule, solveMs map[string][]float64) ([]Result, error) {
	net := cs.regions > 1
	t := allocTally{ratios: map[string][]float64{}, failed: map[string]int{}}
	for seed := 0; seed < r.seeds; seed++ {
		if err := r.compareSeed(cs, label, sc, seed, &t, solveMs); err != nil {
			return nil, err
		}
	}
	var out []Result
	for _, name := range r.strategies {
		note := fmt.Sprintf("even over memory in %d/%d seeds (its predicted time is used anyway)", t.evenOver, r.seeds)
		if t.failed[name] > 0 {
			note += fmt.Sprintf("; %s failed (memory) in %d seeds, left out", name, t.failed[name])
		}
		if name == "skyhive" {
			note += fmt.Sprintf("; skyhive worse than sky or optimal in %d runs", t.worse)
		}
		if len(t.ratios[name]) == 0 {
			out = append(out, Result{Suite: "alloc", Case: label + "/" + sc.name, Metric: name + " failures",
				Value: float64(t.failed[name]), Unit: "seeds", Note: note})
			continue
		}
		st := Summarize(t.ratios[name])
		out = append(out, Result{Suite: "alloc", Case: label + "/" + sc.name, Metric: "even/" + name,
			Value: st.Median, Unit: "x", Min: st.Min, Max: st.Max, Note: note})
		if net && name != "skyhive" {
			st := Summarize(t.ratios[name+"/skyhive"])
			out = append(out, Result{Suite: "alloc", Case: label + "/" + sc.name, Metric: name + "/skyhive",
				Value: st.Median, Unit: "x", Min: st.Min, Max: st.Max, Note: "network-blind plan, network-aware cost"})
		}
	}
	r.o.Logf("alloc %s/%s: even/skyhive %.3f", label, sc.name, Summarize(t.ratios["skyhive"]).Median)
	return out, nil
}

// compareSeed compares the strategies on one seed's problem and adds the
// outcome to t and solveMs.
func (r *allocRun) compareSeed(cs allocCase, label string, sc allocSchedule, seed int, t *allocTally, solveMs map[string][]float64) error {
	cmp, err := alloc.Compare(r.ctx, allocProblem(uint64(seed), cs, sc.micro), r.strats, alloc.CompareOptions{})
	if err != nil {
		return fmt.Errorf("alloc %s seed %d: %w", label, seed, err)
	}
	if even := cmp.Baseline(); even.Err != nil {
		return fmt.Errorf("alloc %s seed %d: even: %w", label, seed, even.Err)
	} else if !even.Result.Report.Feasible() {
		t.evenOver++
	}
	sh, _ := cmp.Get("skyhive")
	if sh.Err != nil {
		return fmt.Errorf("alloc %s seed %d: skyhive: %w", label, seed, sh.Err)
	}
	for _, name := range r.strategies {
		c, _ := cmp.Get(name)
		if errors.Is(c.Err, alloc.ErrInfeasible) {
			t.failed[name]++ // sky's phase 1 can fail on feasible clusters
			continue
		} else if c.Err != nil {
			return fmt.Errorf("alloc %s seed %d: %s: %w", label, seed, name, c.Err)
		}
		res := c.Result
		if sh.Result.Predicted > res.Predicted*(1+1e-9) {
			t.worse++
		}
		t.ratios[name] = append(t.ratios[name], c.SpeedupOnEven)
		if cs.regions > 1 {
			t.ratios[name+"/skyhive"] = append(t.ratios[name+"/skyhive"], res.Predicted/sh.Result.Predicted)
		}
		solveMs[name] = append(solveMs[name], 1e3*res.SolveTime.Seconds())
	}
	return nil
}

// bottleneck measures the paper's objective: skyhive vs the proven
// optimum of the bottleneck objective, over the seeds of case cs.
func (r *allocRun) bottleneck(cs allocCase, label string) (Result, error) {
	var gaps []float64
	proven := 0
	for seed := 0; seed < r.seeds; seed++ {
		p := allocProblem(uint64(seed), cs, 1)
		p.Objective = alloc.ObjBottleneck
		opt, err := r.solve("optimal", p)
		if err != nil {
			return Result{}, fmt.Errorf("alloc %s seed %d: %w", label, seed, err)
		}
		sh, err := r.solve("skyhive", p)
		if err != nil {
			return Result{}, fmt.Errorf("alloc %s seed %d: %w", label, seed, err)
		}
		if opt.Proven {
			proven++
			gaps = append(gaps, sh.Predicted/opt.Predicted)
		}
	}
	st := Summarize(gaps)
	return Result{Suite: "alloc", Case: label + "/bottleneck", Metric: "skyhive/optimal", Value: st.Median,
		Unit: "x", Min: st.Min, Max: st.Max,
		Note: fmt.Sprintf("%d/%d seeds proven", proven, r.seeds)}, nil
}

// solve solves p with a fresh instance of the named strategy.
func (r *allocRun) solve(name string, p alloc.Problem) (*alloc.Result, error) {
	s, err := alloc.Strategies([]string{name}, 5*time.Second)
	if err != nil {
		return nil, err
	}
	res, err := s[0].Solve(r.ctx, p)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	return res, nil
}
