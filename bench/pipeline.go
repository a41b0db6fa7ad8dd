package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/skyhive/skyhive/alloc"
	"github.com/skyhive/skyhive/data"
	"github.com/skyhive/skyhive/pipeline"
)

// pipelineSuite trains a deep MLP over real `skyhive worker` processes on
// loopback with emulated heterogeneous devices, and compares the measured
// iteration time of the even, sky and skyhive plans, the cost model's
// prediction with the measurement, and 1F1B with the sequential schedule.
func pipelineSuite() Suite {
	return Suite{
		Name:  "pipeline",
		Short: "measured iteration time of even/sky/skyhive plans over worker processes; predicted vs measured; 1F1B vs sequential",
		Run:   runPipeline,
	}
}

// Pipeline bench geometry. Every emulated device is pipeBaseSlowdown
// times slower than one core of this machine, times a factor drawn from
// U[1, pipeMaxSlowdown]: the extra slowdown is sleep, so eight workers
// that compute at once stay within the two cores, as separate machines
// would.
const (
	pipeBaseSlowdown = 4.0
	pipeMaxSlowdown  = 4.0
	pipeSeed         = 1
)

func skyhiveBinary() (string, error) {
	exe, err := os.Executable()
	if err == nil && strings.HasPrefix(filepath.Base(exe), "skyhive") {
		return exe, nil
	}
	if p, err := exec.LookPath("skyhive"); err == nil {
		return p, nil
	}
	return "", errors.New("the pipeline suite launches `skyhive worker` processes: run it as `skyhive bench pipeline` or put skyhive on PATH")
}

func runPipeline(o Options) ([]Result, error) {
	workers, model, batch, micro, timeout := 8, "deep-mlp:512x16", 256, 8, 110*time.Second
	if o.Quick {
		workers, model, batch, micro, timeout = 4, "deep-mlp:256x8", 64, 4, 28*time.Second
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	bin, err := skyhiveBinary()
	if err != nil {
		return nil, err
	}
	rng := rand.New(rand.NewPCG(pipeSeed, 0x51d))
	slow := make([]float64, workers)
	for i := range slow {
		slow[i] = pipeBaseSlowdown * (1 + (pipeMaxSlowdown-1)*rng.Float64())
	}
	o.Logf("pipeline: %d workers, slowdowns %s (×%.0f base), model %s, batch %d, %d micro-batches", workers, fmtSlowdowns(slow), pipeBaseSlowdown, model, batch, micro)

	c, err := pipeline.NewCoordinator(ctx, pipeline.CoordinatorConfig{})
	if err != nil {
		return nil, err
	}
	defer c.Close()
	local, err := pipeline.LaunchLocal(ctx, c, pipeline.LocalConfig{
		Binary: bin, Slowdowns: slow, Env: []string{"OPENBLAS_NUM_THREADS=1"}, Output: o.Log,
	})
	if err != nil {
		return nil, err
	}
	defer local.Close()
	defer c.Shutdown(context.Background())

	var log io.Writer = io.Discard
	if o.Log != nil {
		log = o.Log
	}
	s, err := c.Start(ctx, pipeline.SessionConfig{
		Model: model, Seed: pipeSeed, Batch: batch, Micro: micro, Schedule: pipeline.OneFOneB,
		// SGD: its step is one cheap pass, so the iteration time is the
		// pipeline's (the cost model does not include optimizer steps).
		Optim: pipeline.OptimConfig{Kind: "sgd", LR: 0.01, Momentum: 0.9}, Strategy: "even", ProfileReps: 2,
		CheckpointEvery: 1 << 30, Log: log,
	})
	if err != nil {
		return nil, err
	}
	defer s.Close()
	ds, err := data.GaussianBlobs(batch*8, pipeline.InputFeatures, data.NumClasses, pipeSeed)
	if err != nil {
		return nil, err
	}
	loader, err := data.NewLoader(ds, data.BatchOptions{Size: batch, Shuffle: true, Seed: pipeSeed, DropLast: true})
	if err != nil {
		return nil, err
	}
	var batches []data.Batch
	for _, b := range loader.Epoch(0) {
		batches = append(batches, b)
	}
	next := 0
	step := func() (pipeline.IterStats, error) {
		b := batches[next%len(batches)]
		next++
		return s.Step(ctx, b)
	}

	// Plans from the profiled cluster (fixed for the whole run).
	prob := s.Problem()
	strategies := []string{"even", "sky", "skyhive"}
	plans := map[string]alloc.Plan{}
	for _, name := range strategies {
		res, err := alloc.Solve(ctx, name, prob)
		if err != nil {
			return nil, fmt.Errorf("plan %s: %w", name, err)
		}
		plans[name] = res.Plan
		o.Logf("pipeline: %s plan %v, predicted %.1f ms", name, res.Plan.Stages, 1e3*res.Report.Iteration)
	}

	// Alternate the plans: one warm-up iteration after each move, then
	// the measured ones.
	reps := max(o.Reps, 5)
	perVisit := 2
	if o.Quick {
		perVisit = 1
	}
	times := map[string][]float64{}
	for r := 0; len(times["skyhive"]) < reps; r++ {
		for _, name := range strategies {
			if err := s.SetPlan(ctx, plans[name]); err != nil {
				return nil, fmt.Errorf("set %s plan: %w", name, err)
			}
			if _, err := step(); err != nil {
				return nil, err
			}
			for range perVisit {
				st, err := step()
				if err != nil {
					return nil, err
				}
				times[name] = append(times[name], st.Seconds)
			}
		}
	}

	var out []Result
	meds := map[string]Stats{}
	for _, name := range strategies {
		meds[name] = Summarize(times[name])
	}
	for _, name := range strategies {
		st := meds[name]
		r := Result{Suite: "pipeline", Case: fmt.Sprintf("%s/1f1b/%dw", name, workers), Metric: "iter_time", Value: st.Median, Unit: "s", Min: st.Min, Max: st.Max}
		if name != "even" {
			r = r.WithBaseline("even", meds["even"].Median)
		}
		out = append(out, r)
		rep, err := s.Predict(plans[name])
		if err != nil {
			return nil, err
		}
		out = append(out, Result{Suite: "pipeline", Case: fmt.Sprintf("%s/1f1b/%dw", name, workers), Metric: "measured_vs_predicted", Value: st.Median, Unit: "s",
			Note: "ratio = measured / cost model"}.WithBaseline("predicted", rep.Iteration))
	}
	out = append(out, Result{Suite: "pipeline", Case: fmt.Sprintf("skyhive/1f1b/%dw", workers), Metric: "speedup_vs_even", Value: meds["even"].Median / meds["skyhive"].Median, Unit: "x"})

	// 1F1B against the paper's sequential schedule on the skyhive plan,
	// alternating.
	if err := s.SetPlan(ctx, plans["skyhive"]); err != nil {
		return nil, err
	}
	var seq, pipe []float64
	for i := 0; i < reps+1; i++ {
		for _, sched := range []pipeline.Schedule{pipeline.Sequential, pipeline.OneFOneB} {
			if err := s.SetSchedule(sched, micro); err != nil {
				return nil, err
			}
			st, err := step()
			if err != nil {
				return nil, err
			}
			if i == 0 {
				continue // warm-up
			}
			if sched == pipeline.Sequential {
				seq = append(seq, float64(batch)/st.Seconds)
			} else {
				pipe = append(pipe, float64(batch)/st.Seconds)
			}
		}
	}
	sp, pp := Summarize(seq), Summarize(pipe)
	out = append(out, Result{Suite: "pipeline", Case: fmt.Sprintf("skyhive/sequential/%dw", workers), Metric: "throughput", Value: sp.Median, Unit: "samples/s", Min: sp.Min, Max: sp.Max})
	out = append(out, Result{Suite: "pipeline", Case: fmt.Sprintf("skyhive/1f1b/%dw", workers), Metric: "throughput", Value: pp.Median, Unit: "samples/s", Min: pp.Min, Max: pp.Max}.WithBaseline("sequential", sp.Median))
	if err := s.SetSchedule(pipeline.Sequential, 1); err != nil {
		return nil, err
	}
	if rep, err := s.Predict(plans["skyhive"]); err == nil {
		out = append(out, Result{Suite: "pipeline", Case: fmt.Sprintf("skyhive/sequential/%dw", workers), Metric: "measured_vs_predicted", Value: float64(batch) / sp.Median, Unit: "s",
			Note: "ratio = measured / cost model"}.WithBaseline("predicted", rep.Sequential))
	}
	return out, nil
}

func fmtSlowdowns(xs []float64) string {
	parts := make([]string, len(xs))
	for i, x := range xs {
		parts[i] = fmt.Sprintf("%.2f", x/pipeBaseSlowdown)
	}
	return strings.Join(parts, ",")
}
