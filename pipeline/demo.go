package pipeline

import (
	"context"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/skyhive/skyhive/alloc"
	"github.com/skyhive/skyhive/data"
	"github.com/skyhive/skyhive/launch"
	"github.com/skyhive/skyhive/optim"
	"github.com/skyhive/skyhive/profile"
	"github.com/skyhive/skyhive/progress"
	"github.com/skyhive/skyhive/stats"
)

// localSlowdownStream is the stream of the local workers' slowdown draws
// (profile.DrawSlowdowns).
const localSlowdownStream = 0x51d

// LocalSlowdowns draws the slowdowns of n local workers from U[1, max],
// seeded by seed: those of `skyhive train pipeline --slowdown-max` and of
// the demo.
func LocalSlowdowns(n int, max float64, seed uint64) []float64 {
	return profile.DrawSlowdowns(n, 1, max, seed, localSlowdownStream)
}

// demoBaseSlowdown is how many times slower than one core of this machine
// every emulated device of the demo is, before its own slowdown.
const demoBaseSlowdown = 3

// DemoConfig configures Demo, Skyhive's main job on this machine.
type DemoConfig struct {
	// Workers local worker processes (at least 2) with slowdowns drawn
	// from U[1, SlowdownMax] (LocalSlowdowns), started from Binary.
	Workers     int
	SlowdownMax float64
	Binary      string
	// Model trains on Fashion-MNIST (from DataDir; its first Limit
	// training examples when Limit is positive) with batches of Batch
	// examples in Micro micro-batches, for Steps iterations at a peak
	// learning rate LR.
	Model   string
	DataDir string
	Limit   int
	Batch   int
	Micro   int
	Steps   int
	LR      float64
	Seed    uint64
	// CompareIters is the iterations each measured plan runs in the
	// comparison, the first of them unmeasured (at least 5).
	CompareIters int
	// Stats, if set, receives one JSON line per training iteration.
	Stats io.Writer
}

// Check refuses a config the demo cannot run with; its errors are
// *launch.FieldError.
func (cfg DemoConfig) Check() error {
	switch {
	case cfg.Workers < 2:
		return launch.NewFieldError(nil, fmt.Sprintf("%%s must be at least 2, got %d", cfg.Workers), "workers")
	case cfg.Steps < 1 || cfg.Batch < 1 || cfg.Micro < 1:
		return launch.NewFieldError(nil, "%s, %s and %s must be positive", "steps", "batch", "micro")
	case cfg.CompareIters < 5:
		return launch.NewFieldError(nil, fmt.Sprintf("%%s must be at least 5, got %d", cfg.CompareIters), "compare_iters")
	case cfg.Limit < 0:
		return launch.NewFieldError(nil, fmt.Sprintf("%%s must not be negative, got %d", cfg.Limit), "limit")
	case cfg.SlowdownMax < 1:
		return launch.NewFieldError(nil, fmt.Sprintf("%%s must be at least 1, got %v", cfg.SlowdownMax), "slowdown_max")
	}
	return nil
}

// DemoResult is the outcome of Demo.
type DemoResult struct {
	Compared     []DemoStrategy `json:"compared"`
	Iterations   int            `json:"iterations"`
	Seconds      float64        `json:"seconds"`
	SamplesPerS  float64        `json:"samples_per_second"`
	TestAccuracy float64        `json:"test_accuracy"`
	Plan         alloc.Plan     `json:"plan"`
}

// DemoStrategy is one strategy's measured iteration time in the demo.
type DemoStrategy struct {
	Strategy       string     `json:"strategy"`
	Plan           alloc.Plan `json:"plan"`
	MedianSeconds  float64    `json:"median_seconds"`
	MinSeconds     float64    `json:"min_seconds"`
	MaxSeconds     float64    `json:"max_seconds"`
	PredictSeconds float64    `json:"predicted_seconds"`
	SpeedupOnEven  float64    `json:"speedup_over_even"`
}

// Demo runs the main job: it starts the coordinator on a node of its own
// (StartCoordinatorNode) and the workers, profiles them and the model, compares the plans of every strategy (demoCompare) and trains
// with the skyhive plan. Its steps and tables go to out, the sessions'
// notices and the progress bar to log (nil: discarded).
func Demo(ctx context.Context, cfg DemoConfig, out, log io.Writer) (DemoResult, error) {
	var res DemoResult
	if err := cfg.Check(); err != nil {
		return res, err
	}
	if out == nil {
		out = io.Discard
	}
	if log == nil {
		log = io.Discard
	}
	trainSet, testSet, err := loadFashionMNIST(cfg.DataDir, cfg.Limit)
	if err != nil {
		return res, err
	}
	slow := LocalSlowdowns(cfg.Workers, cfg.SlowdownMax, cfg.Seed)
	// Every emulated device is demoBaseSlowdown times slower than one core
	// of this machine, so workers that compute at once barely compete for
	// the cores, as separate machines would not.
	emulated := make([]float64, len(slow))
	for i, f := range slow {
		emulated[i] = demoBaseSlowdown * f
	}
	// The coordinator runs on a node of its own, as train pipeline's does.
	coord := CoordinatorConfig{}
	n, err := StartCoordinatorNode(ctx, coord, CoordinatorNode{Log: log})
	if err != nil {
		return res, err
	}
	defer n.Close()
	coord.Transport = n.Host()
	sc, err := NewScenario(ctx, ScenarioConfig{Coordinator: coord, Binary: cfg.Binary, Slowdowns: emulated, Env: []string{"OPENBLAS_NUM_THREADS=1"}})
	if err != nil {
		return res, err
	}
	defer sc.Close()
	fmt.Fprintf(out, "1/4 starting %d worker processes on loopback (libp2p, TLS) with slowdowns %s (times %.0f)\n", cfg.Workers, fmtFloats(slow), float64(demoBaseSlowdown))
	if err := sc.Launch(ctx); err != nil {
		return res, err
	}

	total := int64(cfg.Steps + 3*cfg.CompareIters)
	// The session logs every plan change; the comparison below changes
	// plans on purpose, so its lines are muted there.
	sessionLog := &switchWriter{w: log}
	fmt.Fprintf(out, "2/4 profiling workers and the layers of %s, planning with every strategy\n", cfg.Model)
	s, err := sc.Start(ctx, SessionConfig{
		Model: cfg.Model, Seed: cfg.Seed, Batch: cfg.Batch, Micro: cfg.Micro, Schedule: OneFOneB,
		Optim:      OptimConfig{LR: cfg.LR, WeightDecay: 0.01},
		LRSchedule: &optim.Schedule{Peak: cfg.LR, Min: cfg.LR / 100, Warmup: 50, Total: total, Decay: optim.Cosine},
		ClipNorm:   5, Strategy: "skyhive", Log: sessionLog,
	})
	if err != nil {
		return res, err
	}
	loader, err := data.NewLoader(trainSet, data.BatchOptions{Size: cfg.Batch, Shuffle: true, Seed: cfg.Seed, DropLast: true})
	if err != nil {
		return res, err
	}
	batches := NewBatches(loader)
	sky, err := demoCompare(ctx, cfg, s, batches, sessionLog, out, &res)
	if err != nil {
		return res, err
	}
	sessionLog.w = log
	fmt.Fprintf(out, "4/4 training %s on Fashion-MNIST for %d iterations with the skyhive plan\n", cfg.Model, cfg.Steps)
	if sky.Err == nil && sky.Strategy != "" {
		if err := s.SetPlan(ctx, sky.Plan); err != nil {
			return res, err
		}
	}
	return res, demoTrain(ctx, cfg, s, batches, testSet, out, log, &res)
}

// demoTrain trains the session for cfg.Steps iterations, showing a
// progress bar on log, evaluates it on testSet and records the training in
// res.
func demoTrain(ctx context.Context, cfg DemoConfig, s *Session, batches *Batches, testSet *data.Dataset, out, log io.Writer, res *DemoResult) error {
	bar := progress.New(log, "pipeline", cfg.Steps)
	var lossSum float64
	first := s.Iter()
	tr, err := s.Train(ctx, TrainOptions{Data: batches, Steps: first + cfg.Steps, Eval: testSet, EvalBatch: 1000, Stats: cfg.Stats,
		OnIteration: func(st IterStats) error {
			if st.Event != "" {
				fmt.Fprintf(log, "\niteration %d: %s\n", st.Iter, st.Event)
			}
			lossSum += st.Loss
			if i := st.Iter + 1 - first; i%20 == 0 || i == cfg.Steps {
				bar.Update(i, int64(i*cfg.Batch), progress.F("loss", lossSum/20))
				lossSum = 0
			}
			return nil
		}})
	if err != nil {
		return err
	}
	secs, acc := tr.Duration.Seconds(), tr.TestAccuracy
	fmt.Fprintf(out, "done: %d iterations in %.1fs (%.0f samples/s) across %d workers; test accuracy %.2f%%\n",
		cfg.Steps, secs, float64(cfg.Steps*cfg.Batch)/secs, len(s.Plan().Stages), 100*acc)
	res.Iterations, res.Seconds, res.SamplesPerS, res.TestAccuracy, res.Plan = cfg.Steps, secs, float64(cfg.Steps*cfg.Batch)/secs, acc, s.Plan()
	return nil
}

// demoCompare plans with every strategy from the profiled cluster and
// prints each plan with its predicted iteration time from the session's
// calibrated simulation of the schedule (alloc's analytic cost model
// beside it), then measures the even, sky and skyhive plans alternately,
// records and prints them against even in res. It returns the skyhive
// entry, whose plan the training installs.
func demoCompare(ctx context.Context, cfg DemoConfig, s *Session, batches *Batches, sessionLog *switchWriter, out io.Writer, res *DemoResult) (PlanComparison, error) {
	cmp, err := s.Compare(ctx, CompareOptions{
		Strategies: []string{"even", "sky", "optimal", "skyhive"},
		Measure:    []string{"even", "sky", "skyhive"},
		Planned: func(cmp PlanComparisons) error {
			tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "STRATEGY\tPLAN\tPREDICTED\tALLOC MODEL\tSOLVE")
			for _, pc := range cmp {
				if pc.Err != nil {
					fmt.Fprintf(tw, "%s\t%v\t\t\t\n", pc.Strategy, pc.Err)
					continue
				}
				fmt.Fprintf(tw, "%s\t%s\t%.1f ms\t%.1f ms\t%s\n", pc.Strategy, planString(pc.Plan), 1e3*pc.Prediction.Iteration, 1e3*pc.Report.Iteration, pc.SolveTime.Round(time.Microsecond))
			}
			tw.Flush()
			fmt.Fprintf(out, "3/4 measuring each plan for %d iterations (1F1B, %d micro-batches), alternating\n", cfg.CompareIters, cfg.Micro)
			sessionLog.w = io.Discard
			return nil
		},
		// The first iteration after a plan change warms up the stages and
		// is not measured.
		Measurement: MeasureOptions{Data: batches, Rounds: cfg.CompareIters - 1},
	})
	if err != nil {
		return PlanComparison{}, err
	}
	tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "STRATEGY\tMEASURED (median)\tMIN..MAX\tPREDICTED\tSPEEDUP OVER EVEN")
	var even float64
	if pc, ok := cmp.Get("even"); ok {
		even = stats.Summarize(pc.Times).Median
	}
	for _, pc := range cmp {
		if len(pc.Times) == 0 {
			continue
		}
		st := stats.Summarize(pc.Times)
		res.Compared = append(res.Compared, DemoStrategy{Strategy: pc.Strategy, Plan: pc.Plan, MedianSeconds: st.Median, MinSeconds: st.Min,
			MaxSeconds: st.Max, PredictSeconds: pc.Prediction.Iteration, SpeedupOnEven: even / st.Median})
		fmt.Fprintf(tw, "%s\t%.1f ms\t%.1f..%.1f\t%.1f ms\t%.2fx\n", pc.Strategy, 1e3*st.Median, 1e3*st.Min, 1e3*st.Max, 1e3*pc.Prediction.Iteration, even/st.Median)
	}
	tw.Flush()
	sky, _ := cmp.Get("skyhive")
	return sky, nil
}

// switchWriter forwards to w, which the owner may swap between writes.
type switchWriter struct{ w io.Writer }

func (s *switchWriter) Write(p []byte) (int, error) { return s.w.Write(p) }

// planString renders a plan as "w1[0,5) | w0[5,17)".
func planString(p alloc.Plan) string {
	parts := make([]string, len(p.Stages))
	for i, st := range p.Stages {
		parts[i] = fmt.Sprintf("w%d[%d,%d)", st.Device, st.First, st.Last)
	}
	return strings.Join(parts, " | ")
}
