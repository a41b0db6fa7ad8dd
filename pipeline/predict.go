package pipeline

import (
	"cmp"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"sort"

	"github.com/skyhive/skyhive/alloc"
)

// costModel holds what the coordinator measured to predict iteration
// times: every layer's forward and backward busy seconds at the batch sizes
// the schedules use (timed without slowdown on the first profiled worker,
// the reference), the reference's whole-model busy time at the profiling
// size, and the optimizer step's busy time per parameter.
//
// A device's factor φ is its emulated (or real) time per reference busy
// second: φ = FLOPs(profile batch) / (speed · refTotal). An op of c
// reference busy seconds takes φ·c on it.
type costModel struct {
	profBatch     int
	modelFLOPs    float64 // whole-model forward+backward FLOPs at profBatch
	refTotal      float64 // reference busy seconds of the whole model at profBatch
	fwd, bwd      map[int][]float64
	optimPerParam float64
	// opOverhead is added to every op and every message: the measured
	// delay between an emulated op's due time and its end (a sleeping
	// worker waking up), which a message's receiver also pays.
	opOverhead float64
	params     []int64 // parameters per layer
	outFloats  []int64 // output floats per example, per layer
	// inFloats is the input floats per example (ModelInfo.InputLen); 0
	// means an image of InputFeatures.
	inFloats int
	// scale corrects every layer's profiled busy time with what a running
	// pipeline measured (Session.Recalibrate); 0 means uncorrected.
	scale float64
	// opBusy is the busy time every op of a stage pays whatever its
	// layers (decoding its input, encoding its output, waking up), in
	// reference seconds: the profile, which times layers inside one
	// whole-model pass, does not see it. Recalibrate measures it.
	opBusy float64
	// jitter is the coefficient of variation of an op's compute time on
	// its device (0: every op takes exactly its expected time). Ops of a
	// pipeline wait for their neighbours', so random op times lengthen an
	// iteration beyond the replay of expected times, most where the stages
	// are balanced and none has slack. Recalibrate takes the stages' measured
	// variation (StageTiming.OpCV).
	jitter float64
}

// jitterDraws is how many jittered replays a prediction takes the median
// of; jitterSeed seeds them, so that a prediction is a function of the
// plan and the calibration.
const (
	jitterDraws = 31
	jitterSeed  = 0x5eed
)

// inputFloats is the number of input floats of one example.
func (cm *costModel) inputFloats() int {
	if cm.inFloats > 0 {
		return cm.inFloats
	}
	return InputFeatures
}

// sizes returns the calibrated batch sizes in increasing order.
func (cm *costModel) sizes() []int {
	var out []int
	for n := range cm.fwd {
		out = append(out, n)
	}
	sort.Ints(out)
	return out
}

// layerTimes returns per-layer forward and backward reference busy seconds
// for a micro-batch of n examples, as profiled (profileTimes) times the
// layers' common correction.
func (cm *costModel) layerTimes(n int) (fwd, bwd []float64) {
	fwd, bwd = cm.profileTimes(n)
	if cm.scale == 0 {
		return fwd, bwd
	}
	f, b := make([]float64, len(fwd)), make([]float64, len(bwd))
	for i := range f {
		f[i], b[i] = fwd[i]*cm.scale, bwd[i]*cm.scale
	}
	return f, b
}

// profileTimes returns per-layer forward and backward reference busy
// seconds for a micro-batch of n examples as the profile measured them: at
// n, or scaled linearly from the nearest calibrated size.
func (cm *costModel) profileTimes(n int) (fwd, bwd []float64) {
	if f, ok := cm.fwd[n]; ok {
		return f, cm.bwd[n]
	}
	best := 0
	for _, m := range cm.sizes() {
		if best == 0 || math.Abs(math.Log(float64(m)/float64(n))) < math.Abs(math.Log(float64(best)/float64(n))) {
			best = m
		}
	}
	r := float64(n) / float64(best)
	fwd, bwd = make([]float64, len(cm.fwd[best])), make([]float64, len(cm.bwd[best]))
	for i := range fwd {
		fwd[i], bwd[i] = r*cm.fwd[best][i], r*cm.bwd[best][i]
	}
	return fwd, bwd
}

// factor is φ of a device of the given speed (FLOP/s at profBatch).
func (cm *costModel) factor(speed float64) float64 {
	return cm.modelFLOPs / (speed * cm.refTotal)
}

// allocModel returns the allocator's model for a batch in m micro-batches:
// each layer's work is its calibrated time at the micro-batch size, times
// m, in the FLOP unit of the devices' speeds, so that alloc's stage
// compute (work/speed) is φ·(reference busy seconds) for the whole batch.
func (cm *costModel) allocModel(base *alloc.Model, batch, m int) *alloc.Model {
	out := *base
	out.Layers = append([]alloc.Layer(nil), base.Layers...)
	out.Batch, out.MicroBatches = batch, m
	mb := (batch + m - 1) / m
	fwd, bwd := cm.layerTimes(mb)
	unit := cm.modelFLOPs / cm.refTotal // FLOPs per reference busy second
	for i := range out.Layers {
		out.Layers[i].FwdFLOPs = fwd[i] * float64(m) * unit
		out.Layers[i].BwdFLOPs = bwd[i] * float64(m) * unit
	}
	return &out
}

// msgOverheadBytes approximates an act message's header and framing.
const msgOverheadBytes = 256

// simStage is one stage of a plan as the simulator sees it.
type simStage struct {
	first, last int
	factor      float64    // φ of its device
	next        alloc.Link // to the next stage (both directions)
	coord       alloc.Link // between the coordinator and the stage
}

// Prediction is the simulated iteration time of a plan and its parts, in
// seconds.
type Prediction struct {
	// Iteration = Dispatch + Pipeline + Collect + Commit.
	Iteration float64 `json:"iteration"`
	// Expected is the iteration replayed with every op at its expected
	// time: Iteration itself when the cost model has no jitter.
	Expected float64 `json:"expected"`
	// Pipeline is from the first stage's start to the last stage's end of
	// the forward/backward passes.
	Pipeline float64 `json:"pipeline"`
	// Overhead is the coordinator's part: dispatching the batch, collecting
	// the stages' answers, and the commit round with the optimizer step.
	Overhead float64 `json:"overhead"`
	// Compute is the busiest stage's compute time (forward+backward).
	Compute float64 `json:"compute"`
	// StageCompute is every stage's compute time (forward+backward), to
	// compare with StageTiming.Compute less its optimizer step.
	StageCompute []float64 `json:"stage_compute,omitempty"`
}

// simulate replays one iteration of schedule sched with the micro-batch
// sizes on the stages: every stage runs its ops (Ops) in order, an op
// starts when its input has arrived and the stage is free and lasts φ
// times its reference busy time (its layers' and opBusy), plus
// opOverhead; a result is sent when the op ends, each
// direction of each link carrying one message at a time (latency plus
// size/bandwidth). A stage answers when its ops are done and its last
// message is acknowledged (a round trip). Dispatch sends stage 0 the
// inputs; after every stage has answered, the commit round trip steps each
// stage's optimizer.
//
// With jitter, every op's compute time is its expected time times a
// log-normal factor of mean 1 and coefficient of variation jitter; the
// prediction is the replay of median iteration time among jitterDraws
// seeded ones, with Compute and StageCompute from the replay of expected
// times.
func (cm *costModel) simulate(stages []simStage, sched Schedule, sizes []int) Prediction {
	exp := cm.replay(stages, sched, sizes, nil)
	exp.Expected = exp.Iteration
	if !(cm.jitter > 0) || math.IsInf(exp.Iteration, 0) {
		return exp
	}
	return cm.jittered(stages, sched, sizes, cm.jitter, exp)
}

// jittered is the median of jitterDraws replays with op times of
// coefficient of variation cv (seeded: the same for every call), with
// expected's compute times.
func (cm *costModel) jittered(stages []simStage, sched Schedule, sizes []int, cv float64, expected Prediction) Prediction {
	sigma := math.Sqrt(math.Log1p(cv * cv))
	rng := rand.New(rand.NewPCG(jitterSeed, 0))
	noise := func() float64 { return math.Exp(sigma*rng.NormFloat64() - sigma*sigma/2) }
	draws := make([]Prediction, jitterDraws)
	for i := range draws {
		draws[i] = cm.replay(stages, sched, sizes, noise)
	}
	slices.SortFunc(draws, func(a, b Prediction) int { return cmp.Compare(a.Iteration, b.Iteration) })
	p := draws[len(draws)/2]
	p.Compute, p.StageCompute, p.Expected = expected.Compute, expected.StageCompute, expected.Iteration
	return p
}

// replay is one replay of simulate; noise, if not nil, draws each op's
// factor on its expected compute time.
func (cm *costModel) replay(stages []simStage, sched Schedule, sizes []int, noise func() float64) Prediction {
	S, M := len(stages), len(sizes)
	type key struct {
		stage, micro int
		backward     bool
	}
	avail := map[key]float64{}
	clock := make([]float64, S)
	busy := make([]float64, S)
	acked := make([]float64, S)
	next := make([]int, S)
	ops := make([][]Op, S)
	linkFree := map[[2]int]float64{}
	cost, inBytes := cm.replayCosts(sizes)
	var start float64 = math.Inf(1)
	for k, st := range stages {
		ops[k] = Ops(sched, k, S, M)
		clock[k] = st.coord.Latency
		if k == 0 {
			clock[k] = st.coord.Transfer(inBytes)
		}
		start = min(start, clock[k])
	}
	for progress := true; progress; {
		progress = false
		for k, st := range stages {
			for next[k] < len(ops[k]) {
				op := ops[k][next[k]]
				ready := clock[k]
				needs := !(op.Backward && k == S-1) && !(!op.Backward && k == 0)
				if needs {
					t, ok := avail[key{k, op.Micro, op.Backward}]
					if !ok {
						break
					}
					ready = max(ready, t)
				}
				n := sizes[op.Micro]
				c := cost[n][0]
				if op.Backward {
					c = cost[n][1]
				}
				d := cm.opTime(st, c, noise)
				end := ready + d
				clock[k], busy[k] = end, busy[k]+d
				next[k]++
				progress = true
				to := k + 1
				link := st.next
				if op.Backward {
					to = k - 1
					if to >= 0 {
						link = stages[to].next
					}
				}
				if to < 0 || to >= S {
					if !op.Backward && k == S-1 {
						avail[key{k, op.Micro, true}] = end
					}
					continue
				}
				// Forward carries this stage's output, backward the
				// gradient of its input (the previous stage's output).
				outLayer := st.last - 1
				if op.Backward {
					outLayer = stages[to].last - 1
				}
				bytes := float64(n)*float64(cm.outFloats[outLayer])*4 + msgOverheadBytes
				lk := [2]int{k, to}
				dep := max(end, linkFree[lk])
				ser := 0.0
				if link.Bandwidth > 0 {
					ser = bytes / link.Bandwidth
				}
				linkFree[lk] = dep + ser
				// The receiver is woken by the message: one more
				// scheduling delay, like the end of a throttled op.
				avail[key{to, op.Micro, op.Backward}] = dep + ser + link.Latency + cm.opOverhead
				// A stage answers the coordinator once its streams are
				// acknowledged: a round trip after the last message leaves.
				acked[k] = max(acked[k], dep+ser+2*link.Latency)
			}
		}
	}
	for k := range stages {
		if next[k] < len(ops[k]) {
			return Prediction{Iteration: math.Inf(1)} // cannot happen: the schedules are deadlock-free
		}
	}
	return cm.replayEnd(stages, start, clock, acked, busy)
}

// replayCosts returns the layers' forward and backward reference times
// for each micro-batch size in sizes, and the bytes of the iteration's
// inputs.
func (cm *costModel) replayCosts(sizes []int) (map[int][2][]float64, float64) {
	cost := map[int][2][]float64{}
	for _, n := range sizes {
		if _, ok := cost[n]; !ok {
			f, b := cm.layerTimes(n)
			cost[n] = [2][]float64{f, b}
		}
	}
	var inBytes float64
	for _, n := range sizes {
		inBytes += float64(n * cm.inputFloats() * 4)
	}
	return cost, inBytes
}

// opTime is the duration of an op of stage st whose layers take c
// reference seconds (forward or backward); noise, if not nil, draws a
// factor on its compute time.
func (cm *costModel) opTime(st simStage, c []float64, noise func() float64) float64 {
	d := 0.0
	for _, v := range c[st.first:st.last] {
		d += v
	}
	d = (d+cm.opBusy)*st.factor + cm.opOverhead
	if noise != nil {
		d = (d-cm.opOverhead)*noise() + cm.opOverhead
	}
	return d
}

// replayEnd completes a replay whose stages started at start and ended
// their ops at clock, their messages acknowledged at acked after busy
// seconds of compute: the stages answer the coordinator, which then runs
// the commit round.
func (cm *costModel) replayEnd(stages []simStage, start float64, clock, acked, busy []float64) Prediction {
	var collect, compute float64
	pipeEnd := 0.0
	for k, st := range stages {
		pipeEnd = max(pipeEnd, clock[k])
		collect = max(collect, max(clock[k], acked[k])+st.coord.Latency)
		compute = max(compute, busy[k])
	}
	commit := 0.0
	for _, st := range stages {
		var p int64
		for _, v := range cm.params[st.first:st.last] {
			p += v
		}
		commit = max(commit, 2*st.coord.Latency+st.factor*cm.optimPerParam*float64(p)+cm.opOverhead)
	}
	total := collect + commit
	return Prediction{Iteration: total, Pipeline: pipeEnd - start, Overhead: total - (pipeEnd - start), Compute: compute, StageCompute: busy}
}

// String summarises the prediction in milliseconds.
func (p Prediction) String() string {
	return fmt.Sprintf("%.1f ms (pipeline %.1f, overhead %.1f, busiest stage %.1f)", 1e3*p.Iteration, 1e3*p.Pipeline, 1e3*p.Overhead, 1e3*p.Compute)
}

// maxJitter bounds the op-time variation a stage may report: ops whose
// times vary more than that are not a device's steady variation.
const maxJitter = 1.5
