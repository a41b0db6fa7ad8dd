package experiment

import (
	"context"
	"fmt"
	"time"

	"github.com/skyhive/skyhive/averaging"
	"github.com/skyhive/skyhive/averaging/optimizer"
	"github.com/skyhive/skyhive/averaging/sim"
	"github.com/skyhive/skyhive/chart"
	"github.com/skyhive/skyhive/data"
)

// averagingConvergence trains Fashion-MNIST with 16 simulated peers whose
// speeds are drawn from U[1,4], once per algorithm, and records the test
// accuracy of the peers' mean model against wall-clock time.
func averagingConvergence() Experiment {
	return Experiment{
		Name:  "averaging-convergence",
		Short: "Fashion-MNIST, 16 peers with speeds U[1,4]: test accuracy vs time for WAGMA, all-reduce SGD and local SGD",
		Run:   runAveragingConvergence,
	}
}

// averagingRun is one algorithm's outcome in the JSON results.
type averagingRun struct {
	Algo           string            `json:"algo"`
	Curve          []sim.EvalPoint   `json:"curve"`
	FinalAccuracy  float64           `json:"final_accuracy"`
	TimeTo85       float64           `json:"seconds_to_85,omitempty"` // 0 if never reached
	StepsPerSecond float64           `json:"steps_per_second_per_peer"`
	Workers        []optimizer.Stats `json:"workers"`
	Config         map[string]any    `json:"config"`
}

func runAveragingConvergence(ctx context.Context, o Options) error {
	const peers = 16
	duration, evalEvery, testN := 4*time.Minute, 10*time.Second, 10000
	if o.Quick {
		duration, evalEvery, testN = 35*time.Second, 5*time.Second, 2000
	}
	tr, err := data.LoadFashionMNIST(o.DataDir, data.Train, data.LoadOptions{Standardize: true})
	if err != nil {
		return err
	}
	test, err := data.LoadFashionMNIST(o.DataDir, data.Test, data.LoadOptions{Standardize: true, Limit: testN})
	if err != nil {
		return err
	}
	slow := sim.DrawSlowdowns(peers, 1, 4, o.Seed)
	base := sim.SimConfig{
		Peers: peers, Model: "mlp-small", Train: tr, Test: test, Batch: 32, LR: 0.02, Momentum: 0.9,
		Slowdowns: slow, BaseStep: 100 * time.Millisecond, Bandwidth: 1e9, Latency: time.Millisecond,
		Timeout: 30 * time.Second, Duration: duration, EvalEvery: evalEvery, Seed: o.Seed,
		Tau: 10, Period: 10,
	}
	var runs []averagingRun
	var series []chart.Series
	for _, algo := range []optimizer.Algo{optimizer.WAGMA, optimizer.AllReduce, optimizer.Local} {
		if !o.Selected(string(algo)) {
			continue
		}
		cfg := base
		cfg.Algo = algo
		o.Logf("averaging-convergence: %s for %v", algo, duration)
		res, err := sim.Simulate(ctx, cfg)
		if err != nil {
			return fmt.Errorf("experiment: %s: %w", algo, err)
		}
		run := averagingRun{Algo: string(algo), Curve: res.Curve, FinalAccuracy: res.FinalAccuracy,
			StepsPerSecond: res.StepsPerSecond, Workers: res.Workers,
			Config: map[string]any{"peers": peers, "group_size": averaging.DefaultGroupSize(peers), "tau": cfg.Tau,
				"period": cfg.Period, "batch": cfg.Batch, "lr": cfg.LR, "momentum": cfg.Momentum,
				"base_step_ms": cfg.BaseStep.Milliseconds(), "slowdowns": slow, "bandwidth_bps": cfg.Bandwidth}}
		s := chart.Series{Name: string(algo)}
		for _, p := range res.Curve {
			if run.TimeTo85 == 0 && p.Accuracy >= 0.85 {
				run.TimeTo85 = p.Seconds
			}
			s.X = append(s.X, p.Seconds)
			s.Y = append(s.Y, 100*p.Accuracy)
		}
		reached := "not reached"
		if run.TimeTo85 > 0 {
			reached = fmt.Sprintf("reached at %.0fs", run.TimeTo85)
		}
		o.Logf("  %s: final accuracy %.2f%%, 85%% %s, %.2f steps/s per peer", algo, 100*res.FinalAccuracy, reached, res.StepsPerSecond)
		runs = append(runs, run)
		series = append(series, s)
	}
	if len(runs) == 0 {
		return fmt.Errorf("averaging-convergence: no run is named %v", o.Only)
	}
	c := chart.Chart{Title: "Fashion-MNIST, 16 peers, speeds U[1,4]", XLabel: "wall-clock time (s)", YLabel: "test accuracy (%)", Series: series}
	jp, pp, err := WriteResults(o, "averaging-convergence", map[string]any{"runs": runs}, c)
	if err != nil {
		return err
	}
	o.Logf("wrote %s and %s", jp, pp)
	return nil
}
