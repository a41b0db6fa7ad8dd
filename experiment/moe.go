package experiment

import (
	"context"
	"fmt"
	"math/rand/v2"
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
	"github.com/skyhive/skyhive/train"
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
		return fmt.Errorf("moe-convergence: no run is named %v", o.Only)
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
	sw, err := sim.New(sctx, dmoeSwarmConfig(o, su, r, grids, rtt))
	if err != nil {
		return res, err
	}
	defer sw.Close()
	o.Logf("  swarm of %d servers with %d experts declared in %.1fs", len(sw.Servers), su.Layers*r.Experts, time.Since(t0).Seconds())

	model, eval := dmoeModels(o, su, grids, rtt)
	// The trainer-side layers live in one master copy. Every trainer is a
	// memnet peer with its own replica; steps are grouped in rounds of
	// su.Round, whose gradients are averaged into one optimizer step, so
	// that a gradient is only a few optimizer steps stale.
	trainer, err := client.NewTrainer(sctx, client.TrainerConfig{
		Model: model, Eval: eval,
		Connect: func(ctx context.Context) (p2p.Transport, client.Getter, error) {
			return sw.NewTrainer(ctx)
		},
		Trainers: su.Trainers, Round: su.Round, Optimizer: optim.AdamWConfig{LR: su.LR},
		Train: trainSet, Batch: su.Batch, Seed: o.Seed,
		EvalBatch: 250, EvalParallel: 8, EvalTimeout: 3 * time.Minute,
	})
	if err != nil {
		return res, err
	}
	evalSet := testSet.Slice(0, su.EvalSubset)
	evaluate := func(ds *data.Dataset, at time.Duration, samples int64) (moePoint, error) {
		_, acc, err := trainer.Evaluate(ctx, ds)
		return moePoint{Seconds: at.Seconds(), Samples: samples, Accuracy: acc}, err
	}
	budget := time.Duration(su.BudgetSec * float64(time.Second))
	st, err := trainer.RunFor(ctx, client.RunOptions{
		Budget: budget,
		// The local layers' learning rate decays along a cosine over the
		// budget (after a 5% warm-up), in milliseconds: late updates are
		// the noisiest under asynchrony.
		LR: optim.Schedule{Peak: su.LR, Min: su.LR / 20, Warmup: budget.Milliseconds() / 20, Total: budget.Milliseconds(), Decay: optim.Cosine},
		// Stagger the start so the trainers do not move in lockstep.
		Stagger: 500*time.Millisecond + 8*rtt,
		// Evaluate snapshots while the trainers run.
		Every: time.Duration(su.EvalEvery * float64(time.Second)),
		OnTick: func(at time.Duration, s client.Stats) {
			p, err := evaluate(evalSet, at, s.Samples)
			if err != nil {
				o.Logf("  eval at %.0fs: %v", p.Seconds, err)
				return
			}
			o.Logf("  %5.0fs  %7d samples  test accuracy %.2f%% (first %d)", p.Seconds, p.Samples, 100*p.Accuracy, evalSet.Len())
			res.Points = append(res.Points, p)
		},
	})
	res.Seconds = st.Elapsed.Seconds()
	res.Samples, res.Steps, res.FailedSteps = st.Samples, st.Steps, st.Failed
	res.SamplesPerSec = float64(res.Samples) / res.Seconds
	if err != nil {
		return res, err
	}
	logServerStats(o, sw)
	p, err := evaluate(testSet, st.Elapsed, st.Samples)
	if err != nil {
		return res, fmt.Errorf("final evaluation: %w", err)
	}
	res.Points = append(res.Points, p)
	res.FinalAccuracy = p.Accuracy
	return res, nil
}

// dmoeSwarmConfig is the expert servers' swarm of run r.
func dmoeSwarmConfig(o Options, su moeSetup, r moeRun, grids []moe.Grid, rtt time.Duration) sim.Config {
	return sim.Config{
		Grids: grids, Servers: su.Servers, RTT: rtt,
		Server: server.Config{Hidden: su.Hidden, Lazy: true, LR: su.ExpertLR, Seed: o.Seed, FailRate: r.FailRate,
			MaxBatch: 4096, BatchTimeout: time.Millisecond, NoUIDRecords: true, StepRows: su.ExpertStepRows, ZeroInit: su.ExpertZeroInit,
			DeclareEvery: time.Duration(su.BudgetSec+30) * time.Second, Expiration: time.Duration(su.BudgetSec+600) * time.Second},
	}
}

// dmoeModels returns the trainers' and the evaluator's model configs for
// expert round trips of rtt.
func dmoeModels(o Options, su moeSetup, grids []moe.Grid, rtt time.Duration) (model, eval client.ModelConfig) {
	// Timeouts are generous: the 2 cores are oversubscribed by design, and
	// a step that times out is wasted work. The evaluator waits longer
	// still so that it measures the model rather than the load.
	model = client.ModelConfig{Inputs: 784, Hidden: su.Hidden, Classes: 10, Grids: grids, CacheTTL: time.Minute, Seed: o.Seed,
		Layer: client.Config{KBest: su.KBest, KMin: 1, ForwardTimeout: 3*rtt + 10*time.Second, TimeoutAfterKMin: rtt + 2*time.Second,
			BackwardTimeout: 3*rtt + 10*time.Second, DeadFor: 5 * time.Second}}
	eval = model
	eval.Layer.ForwardTimeout, eval.Layer.TimeoutAfterKMin, eval.Layer.BackwardTimeout = 3*rtt+60*time.Second, rtt+10*time.Second, 3*rtt+60*time.Second
	eval.Layer.DeadFor = -1
	// A test sample whose experts all fail counts (as a likely miss)
	// instead of aborting the evaluation.
	eval.Layer.AllowZeroOutputs = true
	return model, eval
}

// logServerStats logs the expert servers' forward and backward call
// statistics summed over the swarm.
func logServerStats(o Options, sw *sim.Swarm) {
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
		_, acc := train.Evaluate(model, ds, 500)
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
