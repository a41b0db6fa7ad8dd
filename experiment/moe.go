package experiment

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/skyhive/skyhive/chart"
	"github.com/skyhive/skyhive/data"
	"github.com/skyhive/skyhive/moe"
	"github.com/skyhive/skyhive/moe/client"
	"github.com/skyhive/skyhive/moe/server"
	"github.com/skyhive/skyhive/moe/sim"
	"github.com/skyhive/skyhive/nn"
	"github.com/skyhive/skyhive/optim"
	"github.com/skyhive/skyhive/p2p"
	"github.com/skyhive/skyhive/tensor"
)

// moeRun is one configuration of the convergence experiment.
type moeRun struct {
	Name     string  `json:"name"`
	Experts  int     `json:"experts_per_layer"`
	Grid     []int   `json:"grid"`
	DelayMS  int     `json:"delay_ms"`
	FailRate float64 `json:"fail_rate"`
	Baseline bool    `json:"baseline"`
}

// moePoint is one evaluation during a run.
type moePoint struct {
	Seconds  float64 `json:"seconds"`
	Samples  int64   `json:"samples"`
	Accuracy float64 `json:"accuracy"`
}

// moeRunResult is what one configuration produced.
type moeRunResult struct {
	moeRun
	Points        []moePoint `json:"points"`
	FinalAccuracy float64    `json:"final_test_accuracy"`
	Samples       int64      `json:"samples"`
	SamplesPerSec float64    `json:"samples_per_second"`
	FailedSteps   int64      `json:"failed_steps"`
	Steps         int64      `json:"steps"`
	Seconds       float64    `json:"seconds"`
}

// moeSetup is the scaled-down geometry of the experiment (docs/moe.md).
type moeSetup struct {
	Trainers   int     `json:"trainers"`
	Layers     int     `json:"dmoe_layers"`
	KBest      int     `json:"k_best"`
	Hidden     int     `json:"hidden"`
	Batch      int     `json:"batch_per_trainer"`
	Servers    int     `json:"servers"`
	BudgetSec  float64 `json:"budget_seconds_per_run"`
	EvalEvery  float64 `json:"eval_every_seconds"`
	EvalSubset int     `json:"eval_subset"`
	LR         float64 `json:"trainer_lr"`
	ExpertLR   float64 `json:"expert_lr"`
	// Round is the number of trainer steps whose local-layer gradients
	// are averaged into one optimizer step of the trainer-side layers, so
	// that a gradient is about Trainers/Round optimizer steps stale.
	Round int `json:"steps_per_round"`
	// DelaySplit is the number of sequential round trips a training step
	// makes (a forward and a backward call per DMoE layer); each gets
	// 1/DelaySplit of the run's delay.
	DelaySplit int `json:"round_trips_per_step"`
	// ExpertStepRows is server.Config.StepRows: the backward rows an
	// expert accumulates per optimizer step.
	ExpertStepRows int `json:"expert_step_rows"`
	// ExpertZeroInit is server.Config.ZeroInit: experts start as the
	// identity.
	ExpertZeroInit bool `json:"expert_zero_init"`
}

func moeConvergence() Experiment {
	return Experiment{
		Name:  "moe-convergence",
		Short: "Learning@home convergence: DMoE with 64/256/4096 experts per layer, 100/1000 ms delay, 10% failures, vs a large FFN",
		Run:   runMoEConvergence,
	}
}

func runMoEConvergence(ctx context.Context, o Options) error {
	su := moeSetup{Trainers: 64, Layers: 4, KBest: 4, Hidden: 32, Batch: 64, Servers: 16,
		BudgetSec: 300, EvalEvery: 30, EvalSubset: 2000, LR: 1e-3, ExpertLR: 1e-4, Round: 4,
		ExpertZeroInit: true}
	su.DelaySplit = 2 * su.Layers
	if o.Quick {
		su.BudgetSec, su.EvalEvery, su.EvalSubset = 10, 5, 1000
	}
	runs := []moeRun{
		{Name: "dmoe-64-100ms", Experts: 64, Grid: []int{8, 8}, DelayMS: 100},
		{Name: "dmoe-256-100ms", Experts: 256, Grid: []int{16, 16}, DelayMS: 100},
		{Name: "dmoe-4096-100ms", Experts: 4096, Grid: []int{64, 64}, DelayMS: 100},
		{Name: "dmoe-64-1000ms", Experts: 64, Grid: []int{8, 8}, DelayMS: 1000},
		{Name: "dmoe-256-1000ms", Experts: 256, Grid: []int{16, 16}, DelayMS: 1000},
		{Name: "dmoe-4096-1000ms", Experts: 4096, Grid: []int{64, 64}, DelayMS: 1000},
		{Name: "dmoe-256-100ms-10%fail", Experts: 256, Grid: []int{16, 16}, DelayMS: 100, FailRate: 0.1},
		{Name: "large-ffn", Baseline: true},
	}
	if o.Quick {
		runs = []moeRun{runs[0], runs[6], runs[7]}
	}
	var sel []moeRun
	for _, r := range runs {
		if o.Selected(r.Name) {
			sel = append(sel, r)
		}
	}
	if len(sel) == 0 {
		return fmt.Errorf("moe-convergence: --only %v matches none of the runs", o.Only)
	}
	runs = sel
	dir := o.DataDir
	if dir == "" {
		dir = data.DefaultDir
	}
	trainSet, err := data.LoadFashionMNIST(dir, data.Train, data.LoadOptions{Standardize: true})
	if err != nil {
		return err
	}
	testSet, err := data.LoadFashionMNIST(dir, data.Test, data.LoadOptions{Standardize: true})
	if err != nil {
		return err
	}
	_, shuffled, err := trainSet.Split(0, o.Seed)
	if err != nil {
		return err
	}
	var results []moeRunResult
	c := chart.Chart{Title: "DMoE convergence on Fashion-MNIST (64 simulated trainers)", XLabel: "wall-clock seconds", YLabel: "test accuracy", YMin: 0.5, YMax: 0.95}
	for _, r := range runs {
		o.Logf("moe-convergence: %s", r.Name)
		var res moeRunResult
		if r.Baseline {
			res, err = runLargeFFN(ctx, o, su, r, shuffled, testSet)
		} else {
			res, err = runDMoE(ctx, o, su, r, shuffled, testSet)
		}
		if err != nil {
			return fmt.Errorf("moe-convergence %s: %w", r.Name, err)
		}
		o.Logf("moe-convergence: %s: final test accuracy %.2f%% after %.0fs, %d samples (%.0f/s), %d of %d steps failed",
			r.Name, 100*res.FinalAccuracy, res.Seconds, res.Samples, res.SamplesPerSec, res.FailedSteps, res.Steps)
		results = append(results, res)
		s := chart.Series{Name: r.Name}
		for _, p := range res.Points {
			s.X = append(s.X, p.Seconds)
			s.Y = append(s.Y, p.Accuracy)
		}
		c.Series = append(c.Series, s)
	}
	out := struct {
		Setup  moeSetup       `json:"setup"`
		Quick  bool           `json:"quick"`
		Seed   uint64         `json:"seed"`
		Runs   []moeRunResult `json:"runs"`
		Date   string         `json:"date"`
		Engine string         `json:"gemm_backend"`
	}{su, o.Quick, o.Seed, results, time.Now().UTC().Format(time.RFC3339), tensor.Backend()}
	jp, pp, err := WriteResults(o, "moe-convergence", out, c)
	if err != nil {
		return err
	}
	o.Logf("wrote %s and %s", jp, pp)
	return nil
}

func runDMoE(ctx context.Context, o Options, su moeSetup, r moeRun, trainSet, testSet *data.Dataset) (moeRunResult, error) {
	res := moeRunResult{moeRun: r}
	grids := make([]moe.Grid, su.Layers)
	for i := range grids {
		grids[i] = moe.Grid{Prefix: fmt.Sprintf("l%d", i), Size: r.Grid}
	}
	// Learning@home's delay is the latency of a whole training step: its
	// trainers sleep once per step, for an exponentially distributed time
	// of that mean, between computing and applying gradients. Here a step
	// is 2·Layers sequential round trips to experts (a forward and a
	// backward call per DMoE layer), so each round trip gets the delay's
	// share and a step is delayed by DelayMS in total.
	rtt := time.Duration(r.DelayMS) * time.Millisecond / time.Duration(su.DelaySplit)
	sctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	t0 := time.Now()
	sw, err := sim.New(sctx, sim.Config{
		Grids: grids, Servers: su.Servers, RTT: rtt,
		Server: server.Config{Hidden: su.Hidden, Lazy: true, LR: su.ExpertLR, Seed: o.Seed, FailRate: r.FailRate,
			MaxBatch: 4096, BatchTimeout: time.Millisecond, NoUIDRecords: true, StepRows: su.ExpertStepRows, ZeroInit: su.ExpertZeroInit,
			DeclareEvery: time.Duration(su.BudgetSec+30) * time.Second, Expiration: time.Duration(su.BudgetSec+600) * time.Second},
	})
	if err != nil {
		return res, err
	}
	defer sw.Close()
	o.Logf("  swarm of %d servers with %d experts declared in %.1fs", len(sw.Servers), su.Layers*r.Experts, time.Since(t0).Seconds())

	// Timeouts are generous: the 2 cores are oversubscribed by design, and
	// a step that times out is wasted work. The evaluator waits longer
	// still so that it measures the model rather than the load.
	type peerSide struct {
		tr     p2p.Transport
		search []*client.BeamSearch
	}
	newPeer := func(ctx context.Context) (peerSide, error) {
		tr, d, err := sw.NewTrainer(ctx)
		if err != nil {
			return peerSide{}, err
		}
		ps := peerSide{tr: tr}
		for _, g := range grids {
			bs, err := client.NewBeamSearch(d, g, su.KBest, time.Minute)
			if err != nil {
				return peerSide{}, err
			}
			ps.search = append(ps.search, bs)
		}
		return ps, nil
	}
	newModel := func(p peerSide, eval bool) (*client.Model, error) {
		timeout, afterK, deadFor := 3*rtt+10*time.Second, rtt+2*time.Second, 5*time.Second
		if eval {
			timeout, afterK, deadFor = 3*rtt+60*time.Second, rtt+10*time.Second, -1
		}
		var layers []client.Config
		for _, bs := range p.search {
			layers = append(layers, client.Config{In: su.Hidden, Search: bs, Transport: p.tr, KBest: su.KBest, KMin: 1,
				ForwardTimeout: timeout, TimeoutAfterKMin: afterK, BackwardTimeout: timeout, DeadFor: deadFor,
				// A test sample whose experts all fail counts (as a
				// likely miss) instead of aborting the evaluation.
				AllowZeroOutputs: eval})
		}
		return client.NewModel(784, su.Hidden, 10, layers, o.Seed)
	}
	// The trainer-side layers live in one master copy. Every trainer
	// works on its own replica; steps are grouped in rounds of su.Round,
	// whose gradients are averaged into one optimizer step, so that a
	// gradient is only a few optimizer steps stale.
	mp, err := newPeer(sctx)
	if err != nil {
		return res, err
	}
	master, err := newModel(mp, false)
	if err != nil {
		return res, err
	}
	shared := newRoundShared(master, optim.NewAdamW(master.Params(), optim.AdamWConfig{LR: su.LR}), su.Round)
	replicas := make([]*client.Model, su.Trainers)
	for t := range replicas {
		p, err := newPeer(sctx)
		if err != nil {
			return res, err
		}
		if replicas[t], err = newModel(p, false); err != nil {
			return res, err
		}
	}
	ep, err := newPeer(sctx)
	if err != nil {
		return res, err
	}
	evalModel, err := newModel(ep, true)
	if err != nil {
		return res, err
	}
	evalSet := testSet.Slice(0, su.EvalSubset)

	budget := time.Duration(su.BudgetSec * float64(time.Second))
	var samples, steps, failed atomic.Int64
	start := time.Now()
	tctx, tcancel := context.WithTimeout(ctx, budget)
	defer tcancel()
	var wg sync.WaitGroup
	for i, m := range replicas {
		shard, err := trainSet.Shard(i, len(replicas))
		if err != nil {
			return res, err
		}
		loader, err := data.NewLoader(shard, data.BatchOptions{Size: su.Batch, Shuffle: true, Seed: o.Seed + uint64(i), DropLast: true})
		if err != nil {
			return res, err
		}
		wg.Go(func() {
			ps := m.Params()
			// Stagger the start so the trainers do not move in lockstep.
			rng := rand.New(rand.NewPCG(o.Seed, uint64(i)))
			select {
			case <-time.After(time.Duration(rng.Int64N(int64(500*time.Millisecond + 8*rtt)))):
			case <-tctx.Done():
				return
			}
			for epoch := 0; epoch < 1000 && tctx.Err() == nil; epoch++ {
				for _, b := range loader.Epoch(epoch) {
					if tctx.Err() != nil {
						return
					}
					nn.ZeroGrad(ps)
					d, _, _, err := m.StepDeferred(tctx, b.X, b.Y)
					steps.Add(1)
					if err != nil {
						if tctx.Err() == nil {
							failed.Add(1)
						}
						continue
					}
					shared.apply(m, d)
					samples.Add(int64(b.Len()))
				}
			}
		})
	}
	// The local layers' learning rate decays along a cosine over the
	// budget (after a short warm-up): late updates are the noisiest under
	// asynchrony.
	wg.Go(func() {
		t := time.NewTicker(100 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-tctx.Done():
				return
			case <-t.C:
				shared.setLR(moeLR(su.LR, time.Since(start), budget))
			}
		}
	})
	// Evaluate snapshots while the trainers run.
	evalTicker := time.NewTicker(time.Duration(su.EvalEvery * float64(time.Second)))
	evaluate := func(ds *data.Dataset) (moePoint, error) {
		at := time.Since(start).Seconds()
		n := samples.Load()
		shared.sync(evalModel)
		ectx, cancel := context.WithTimeout(ctx, 3*time.Minute)
		defer cancel()
		_, acc, err := evalModel.Evaluate(ectx, ds, 250, 8)
		return moePoint{Seconds: at, Samples: n, Accuracy: acc}, err
	}
loop:
	for {
		select {
		case <-tctx.Done():
			break loop
		case <-evalTicker.C:
			p, err := evaluate(evalSet)
			if err != nil {
				o.Logf("  eval at %.0fs: %v", p.Seconds, err)
				continue
			}
			o.Logf("  %5.0fs  %7d samples  test accuracy %.2f%% (first %d)", p.Seconds, p.Samples, 100*p.Accuracy, evalSet.Len())
			res.Points = append(res.Points, p)
		}
	}
	evalTicker.Stop()
	wg.Wait()
	res.Seconds = time.Since(start).Seconds()
	res.Samples, res.Steps, res.FailedSteps = samples.Load(), steps.Load(), failed.Load()
	res.SamplesPerSec = float64(res.Samples) / res.Seconds
	var fw, bw server.CallStats
	for _, srv := range sw.Servers {
		for _, e := range srv.Stats().Experts {
			fw.Requests += e.Forward.Requests
			fw.Batches += e.Forward.Batches
			fw.Rows += e.Forward.Rows
			fw.LatencySeconds += e.Forward.LatencySeconds
			fw.RunSeconds += e.Forward.RunSeconds
			bw.Requests += e.Backward.Requests
			bw.Batches += e.Backward.Batches
			bw.Rows += e.Backward.Rows
			bw.LatencySeconds += e.Backward.LatencySeconds
			bw.RunSeconds += e.Backward.RunSeconds
		}
	}
	o.Logf("  servers: forward %d requests in %d batches (mean %.1f rows, latency %v, compute %.1fs); backward %d requests in %d batches (mean %.1f rows, latency %v, compute %.1fs)",
		fw.Requests, fw.Batches, fw.MeanBatch(), fw.MeanLatency(), fw.RunSeconds, bw.Requests, bw.Batches, bw.MeanBatch(), bw.MeanLatency(), bw.RunSeconds)
	p, err := evaluate(testSet)
	if err != nil {
		return res, fmt.Errorf("final evaluation: %w", err)
	}
	p.Seconds = res.Seconds
	res.Points = append(res.Points, p)
	res.FinalAccuracy = p.Accuracy
	if ctx.Err() != nil {
		return res, ctx.Err()
	}
	return res, nil
}

// runLargeFFN trains the baseline in one process: the same input layer and
// classifier around 4 residual blocks x + FFN(LN(x)) whose inner size is
// k_best times an expert's (the work of the k experts a DMoE sample visits).
func runLargeFFN(ctx context.Context, o Options, su moeSetup, r moeRun, trainSet, testSet *data.Dataset) (moeRunResult, error) {
	res := moeRunResult{moeRun: r}
	rng := rand.New(rand.NewPCG(o.Seed, 0xba5e))
	h := su.Hidden
	layers := []nn.Layer{{Name: "in", Module: nn.NewLinear(784, h, nn.HeStd(784), rng)}, {Name: "relu", Module: nn.ReLU{}}}
	for i := range su.Layers {
		blk := &nn.Expert{LN: nn.NewLayerNorm(h, 1e-5), FFN: nn.NewFFN(h, 4*h*su.KBest, nn.ReLU{}, 0, rng)}
		layers = append(layers, nn.Layer{Name: fmt.Sprintf("ffn%d", i), Module: blk})
	}
	layers = append(layers, nn.Layer{Name: "out", Module: nn.NewLinear(h, 10, nn.XavierStd(h, 10), rng)})
	model := nn.NewSequential(layers...)
	opt := optim.NewAdamW(model.Params(), optim.AdamWConfig{LR: su.LR})
	loader, err := data.NewLoader(trainSet, data.BatchOptions{Size: 128, Shuffle: true, Seed: o.Seed, DropLast: true})
	if err != nil {
		return res, err
	}
	budget := time.Duration(su.BudgetSec * float64(time.Second))
	evalSet := testSet.Slice(0, su.EvalSubset)
	start := time.Now()
	nextEval := time.Duration(su.EvalEvery * float64(time.Second))
	var evalTime time.Duration
	eval := func(ds *data.Dataset) moePoint {
		t := time.Now()
		_, acc := evaluateLocal(model, ds)
		evalTime += time.Since(t)
		return moePoint{Seconds: (time.Since(start) - evalTime).Seconds(), Samples: res.Samples, Accuracy: acc}
	}
	for epoch := 0; epoch < 1000; epoch++ {
		for _, b := range loader.Epoch(epoch) {
			el := time.Since(start) - evalTime
			if el >= budget || ctx.Err() != nil {
				goto done
			}
			if el >= nextEval {
				p := eval(evalSet)
				o.Logf("  %5.0fs  %7d samples  test accuracy %.2f%% (first %d)", p.Seconds, p.Samples, 100*p.Accuracy, evalSet.Len())
				res.Points = append(res.Points, p)
				nextEval += time.Duration(su.EvalEvery * float64(time.Second))
			}
			opt.ZeroGrad()
			logits, st := model.Forward(nn.Ctx{Train: true}, b.X)
			_, dl := nn.SoftmaxCrossEntropy(logits, b.Y)
			model.Backward(st, dl)
			opt.Step()
			res.Samples += int64(b.Len())
			res.Steps++
		}
	}
done:
	if ctx.Err() != nil {
		return res, ctx.Err()
	}
	res.Seconds = (time.Since(start) - evalTime).Seconds()
	res.SamplesPerSec = float64(res.Samples) / res.Seconds
	p := eval(testSet)
	p.Seconds = res.Seconds
	res.Points = append(res.Points, p)
	res.FinalAccuracy = p.Accuracy
	return res, nil
}

func evaluateLocal(m nn.Module, ds *data.Dataset) (float64, float64) {
	var loss, correct float64
	for lo := 0; lo < ds.Len(); lo += 500 {
		b := ds.Slice(lo, min(lo+500, ds.Len()))
		logits, _ := m.Forward(nn.Ctx{}, b.X)
		l, _ := nn.SoftmaxCrossEntropy(logits, b.Y)
		loss += float64(l) * float64(b.Len())
		correct += nn.Accuracy(logits, b.Y) * float64(b.Len())
	}
	return loss / float64(ds.Len()), correct / float64(ds.Len())
}

// moeLR is the trainers' learning rate at time t of a run of length total:
// a linear warm-up over the first 5%, then a cosine decay to 5% of peak.
func moeLR(peak float64, t, total time.Duration) float64 {
	f := t.Seconds() / total.Seconds()
	if f < 0.05 {
		return peak * (0.1 + 0.9*f/0.05)
	}
	f = min((f-0.05)/0.95, 1)
	return peak * (0.05 + 0.95*0.5*(1+math.Cos(math.Pi*f)))
}

// roundShared holds the trainer-side layers (input layer, gates, classifier)
// of the simulated trainers. Each step's gradients are added to the master's
// (the local layers' ones recomputed with the master's current weights, as
// client.Shared does), and every `every` steps their mean is applied in one
// optimizer step. The replica then gets the master's current weights.
type roundShared struct {
	mu      sync.Mutex
	master  *client.Model
	params  []*nn.Param
	opt     optim.Optimizer
	every   int
	pending int
}

func newRoundShared(master *client.Model, opt optim.Optimizer, every int) *roundShared {
	s := &roundShared{master: master, params: master.Params(), opt: opt, every: max(every, 1)}
	nn.ZeroGrad(s.params)
	return s
}

func (s *roundShared) apply(replica *client.Model, d client.Deferred) {
	rp := replica.Params()
	s.mu.Lock()
	defer s.mu.Unlock()
	for i, p := range s.params {
		tensor.Axpy(1, rp[i].Grad.Data, p.Grad.Data)
	}
	s.master.ApplyDeferred(d)
	if s.pending++; s.pending >= s.every {
		for _, p := range s.params {
			tensor.Scale(1/float32(s.pending), p.Grad.Data)
		}
		s.opt.Step()
		nn.ZeroGrad(s.params)
		s.pending = 0
	}
	s.copyTo(rp)
}

func (s *roundShared) sync(replica *client.Model) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.copyTo(replica.Params())
}

func (s *roundShared) setLR(lr float64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.opt.SetLR(lr)
}

func (s *roundShared) copyTo(rp []*nn.Param) {
	for i, p := range s.params {
		copy(rp[i].Value.Data, p.Value.Data)
	}
}
