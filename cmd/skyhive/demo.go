package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/skyhive/skyhive/alloc"
	"github.com/skyhive/skyhive/bench"
	"github.com/skyhive/skyhive/data"
	"github.com/skyhive/skyhive/optim"
	"github.com/skyhive/skyhive/pipeline"
	"github.com/skyhive/skyhive/progress"
	"github.com/spf13/cobra"
)

// demoBaseSlowdown is how many times slower than one core of this machine
// every emulated device is, before its own slowdown.
const demoBaseSlowdown = 3

// demoConfig configures the main job.
type demoConfig struct {
	workers     int
	slowdownMax float64
	model       string
	batch       int
	micro       int
	steps       int
	compareIter int
	lr          float64
	seed        uint64
	data        dataFlags
	out         outputFlags
}

// demoResult is what demo --json prints.
type demoResult struct {
	Compared     []demoStrategy `json:"compared"`
	Iterations   int            `json:"iterations"`
	Seconds      float64        `json:"seconds"`
	SamplesPerS  float64        `json:"samples_per_second"`
	TestAccuracy float64        `json:"test_accuracy"`
	Plan         alloc.Plan     `json:"plan"`
}

// demoStrategy is one strategy's measured iteration time in the demo.
type demoStrategy struct {
	Strategy       string     `json:"strategy"`
	Plan           alloc.Plan `json:"plan"`
	MedianSeconds  float64    `json:"median_seconds"`
	MinSeconds     float64    `json:"min_seconds"`
	MaxSeconds     float64    `json:"max_seconds"`
	PredictSeconds float64    `json:"predicted_seconds"`
	SpeedupOnEven  float64    `json:"speedup_over_even"`
}

func newDemoCmd() *cobra.Command {
	var d demoConfig
	cmd := &cobra.Command{
		Use:   "demo",
		Short: "Run the main job: a local heterogeneous swarm trains Fashion-MNIST through a pipeline",
		Long: "Run Skyhive's main job on this machine, with no cluster and no external service:\n" +
			"start worker processes with unequal speeds, profile them and the model's layers, plan the\n" +
			"pipeline with every allocation strategy, measure even, sky and skyhive plans side by side,\n" +
			"then train on Fashion-MNIST with the skyhive plan and evaluate on the test set.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			out := cmd.OutOrStdout()
			if d.out.json {
				out = cmd.ErrOrStderr()
			}
			res, err := runDemo(cmd.Context(), d, out, cmd.ErrOrStderr())
			if err != nil || !d.out.json {
				return err
			}
			return printJSON(cmd.OutOrStdout(), res)
		},
	}
	fl := cmd.Flags()
	fl.IntVar(&d.workers, "workers", 4, "local worker processes")
	fl.Float64Var(&d.slowdownMax, "slowdown-max", 6, "worker slowdowns are drawn from U[1,MAX] as in Sky Computing")
	fl.StringVar(&d.model, "model", "deep-mlp:256x8", "model: mlp, bert-tiny or deep-mlp:WIDTHxDEPTH")
	fl.IntVar(&d.batch, "batch", 128, "examples per iteration")
	fl.IntVar(&d.micro, "micro", 4, "micro-batches per iteration (1F1B schedule)")
	fl.IntVar(&d.steps, "steps", 1000, "training iterations with the skyhive plan")
	fl.IntVar(&d.compareIter, "compare-iters", 6, "timed iterations per strategy in the comparison (at least 5)")
	fl.Float64Var(&d.lr, "lr", 1e-3, "peak learning rate (AdamW)")
	fl.Uint64Var(&d.seed, "seed", 1, "seed for slowdowns, initialisation and shuffling")
	d.data.register(fl)
	d.out.register(fl, "the result (measured plans, training)", "one per training iteration, with per-stage times")
	cmd.AddCommand(newDemoAveragingCmd())
	cmd.AddCommand(newDemoMoECmd())
	return cmd
}

// validate refuses flags the demo cannot run with.
func (d demoConfig) validate() error {
	switch {
	case d.workers < 2:
		return fmt.Errorf("--workers must be at least 2, got %d", d.workers)
	case d.steps < 1 || d.batch < 1 || d.micro < 1:
		return fmt.Errorf("--steps, --batch and --micro must be positive")
	case d.compareIter < 5:
		return fmt.Errorf("--compare-iters must be at least 5, got %d", d.compareIter)
	}
	return nil
}

// runDemo runs the main job: it starts the workers, profiles them and the
// model, compares the plans of every strategy (demoCompare) and trains with
// the skyhive plan.
func runDemo(ctx context.Context, d demoConfig, out, log io.Writer) (demoResult, error) {
	var res demoResult
	if err := d.validate(); err != nil {
		return res, err
	}
	trainSet, testSet, err := d.data.load()
	if err != nil {
		return res, err
	}
	stats, closeStats, err := d.out.openStats()
	if err != nil {
		return res, err
	}
	defer closeStats()
	pf := pipelineFlags{workers: d.workers, slowdownMax: d.slowdownMax}
	slow, err := pf.localSlowdowns(d.seed)
	if err != nil {
		return res, err
	}
	// Every emulated device is demoBaseSlowdown times slower than one core
	// of this machine, so workers that compute at once barely compete for
	// the cores, as separate machines would not.
	emulated := make([]float64, len(slow))
	for i, f := range slow {
		emulated[i] = demoBaseSlowdown * f
	}
	exe, err := os.Executable()
	if err != nil {
		return res, fmt.Errorf("locating the skyhive binary: %w", err)
	}
	sc, err := pipeline.NewScenario(ctx, pipeline.ScenarioConfig{Binary: exe, Slowdowns: emulated, Env: []string{"OPENBLAS_NUM_THREADS=1"}})
	if err != nil {
		return res, err
	}
	defer sc.Close()
	fmt.Fprintf(out, "1/4 starting %d worker processes on loopback (libp2p, TLS) with slowdowns %s (times %.0f)\n", d.workers, fmtFloats(slow), float64(demoBaseSlowdown))
	if err := sc.Launch(ctx); err != nil {
		return res, err
	}

	total := int64(d.steps + 3*d.compareIter)
	// The session logs every plan change; the comparison below changes
	// plans on purpose, so its lines are muted there.
	sessionLog := &switchWriter{w: log}
	fmt.Fprintf(out, "2/4 profiling workers and the layers of %s, planning with every strategy\n", d.model)
	s, err := sc.Start(ctx, pipeline.SessionConfig{
		Model: d.model, Seed: d.seed, Batch: d.batch, Micro: d.micro, Schedule: pipeline.OneFOneB,
		Optim:      pipeline.OptimConfig{LR: d.lr, WeightDecay: 0.01},
		LRSchedule: &optim.Schedule{Peak: d.lr, Min: d.lr / 100, Warmup: 50, Total: total, Decay: optim.Cosine},
		ClipNorm:   5, Strategy: "skyhive", Log: sessionLog,
	})
	if err != nil {
		return res, err
	}
	loader, err := data.NewLoader(trainSet, data.BatchOptions{Size: d.batch, Shuffle: true, Seed: d.seed, DropLast: true})
	if err != nil {
		return res, err
	}
	batches := pipeline.NewBatches(loader)
	sky, err := demoCompare(ctx, d, s, batches, sessionLog, out, &res)
	if err != nil {
		return res, err
	}

	sessionLog.w = log
	fmt.Fprintf(out, "4/4 training %s on Fashion-MNIST for %d iterations with the skyhive plan\n", d.model, d.steps)
	if sky.Err == nil && sky.Strategy != "" {
		if err := s.SetPlan(ctx, sky.Plan); err != nil {
			return res, err
		}
	}
	bar := progress.New(log, "pipeline", d.steps)
	var lossSum float64
	first := s.Iter()
	tr, err := s.Train(ctx, pipeline.TrainOptions{Data: batches, Steps: first + d.steps, Eval: testSet, EvalBatch: 1000, Stats: stats,
		OnIteration: func(st pipeline.IterStats) error {
			if st.Event != "" {
				fmt.Fprintf(log, "\niteration %d: %s\n", st.Iter, st.Event)
			}
			lossSum += st.Loss
			if i := st.Iter + 1 - first; i%20 == 0 || i == d.steps {
				bar.Update(i, int64(i*d.batch), progress.F("loss", lossSum/20))
				lossSum = 0
			}
			return nil
		}})
	if err != nil {
		return res, err
	}
	secs, acc := tr.Duration.Seconds(), tr.TestAccuracy
	fmt.Fprintf(out, "done: %d iterations in %.1fs (%.0f samples/s) across %d workers; test accuracy %.2f%%\n",
		d.steps, secs, float64(d.steps*d.batch)/secs, len(s.Plan().Stages), 100*acc)
	res.Iterations, res.Seconds, res.SamplesPerS, res.TestAccuracy, res.Plan = d.steps, secs, float64(d.steps*d.batch)/secs, acc, s.Plan()
	return res, nil
}

// demoCompare plans with every strategy from the profiled cluster and
// prints each plan with its predicted iteration time from the session's
// calibrated simulation of the schedule (alloc's analytic cost model
// beside it), then measures the even, sky and skyhive plans alternately,
// records and prints them against even in res. It returns the skyhive
// entry, whose plan the training installs.
func demoCompare(ctx context.Context, d demoConfig, s *pipeline.Session, batches *pipeline.Batches, sessionLog *switchWriter, out io.Writer, res *demoResult) (pipeline.PlanComparison, error) {
	cmp, err := s.Compare(ctx, pipeline.CompareOptions{
		Strategies: []string{"even", "sky", "optimal", "skyhive"},
		Measure:    []string{"even", "sky", "skyhive"},
		Planned: func(cmp pipeline.PlanComparisons) error {
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
			fmt.Fprintf(out, "3/4 measuring each plan for %d iterations (1F1B, %d micro-batches), alternating\n", d.compareIter, d.micro)
			sessionLog.w = io.Discard
			return nil
		},
		// The first iteration after a plan change warms up the stages and
		// is not measured.
		Measurement: pipeline.MeasureOptions{Data: batches, Rounds: d.compareIter - 1},
	})
	if err != nil {
		return pipeline.PlanComparison{}, err
	}
	tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "STRATEGY\tMEASURED (median)\tMIN..MAX\tPREDICTED\tSPEEDUP OVER EVEN")
	var even float64
	if pc, ok := cmp.Get("even"); ok {
		even = bench.Summarize(pc.Times).Median
	}
	for _, pc := range cmp {
		if len(pc.Times) == 0 {
			continue
		}
		st := bench.Summarize(pc.Times)
		res.Compared = append(res.Compared, demoStrategy{Strategy: pc.Strategy, Plan: pc.Plan, MedianSeconds: st.Median, MinSeconds: st.Min,
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
