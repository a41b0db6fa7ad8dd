package pipeline

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/skyhive/skyhive/p2p/memnet"
)

func TestCoordinatorMetrics(t *testing.T) {
	reg := prometheus.NewRegistry()
	c := &Coordinator{workers: []*WorkerInfo{{Alive: true}, {Alive: true}, {Alive: false}}}
	m, err := newCoordMetrics(c, reg)
	if err != nil {
		t.Fatal(err)
	}
	m.plan(1, 2)
	it := IterStats{Loss: 2.25, Accuracy: 0.5, Seconds: 0.2, Stages: []StageTiming{
		{Stage: 0, Compute: 0.1, Comm: 0.01, Idle: 0.05},
		{Stage: 1, Compute: 0.125, Comm: 0, Idle: 0.025},
	}}
	m.iteration(it, 32)
	m.iteration(it, 32)
	m.replanned(true)
	m.plan(2, 2)
	want := `
# HELP skyhive_pipeline_iterations_total Pipeline iterations committed.
# TYPE skyhive_pipeline_iterations_total counter
skyhive_pipeline_iterations_total 2
# HELP skyhive_pipeline_plan_generation Generation of the running plan (it grows with every plan installed).
# TYPE skyhive_pipeline_plan_generation gauge
skyhive_pipeline_plan_generation 2
# HELP skyhive_pipeline_replans_total Plans installed after the first, by reason: failure (a worker failed or died) or drift (a stage's speed drifted from the plan).
# TYPE skyhive_pipeline_replans_total counter
skyhive_pipeline_replans_total{reason="drift"} 0
skyhive_pipeline_replans_total{reason="failure"} 1
# HELP skyhive_pipeline_stage_compute_seconds_total Compute time of each stage in committed iterations: forward, backward and optimizer step, emulated slowdown included.
# TYPE skyhive_pipeline_stage_compute_seconds_total counter
skyhive_pipeline_stage_compute_seconds_total{stage="0"} 0.2
skyhive_pipeline_stage_compute_seconds_total{stage="1"} 0.25
# HELP skyhive_pipeline_stage_idle_seconds_total Time each stage waited for a neighbour's activations or gradients.
# TYPE skyhive_pipeline_stage_idle_seconds_total counter
skyhive_pipeline_stage_idle_seconds_total{stage="0"} 0.1
skyhive_pipeline_stage_idle_seconds_total{stage="1"} 0.05
# HELP skyhive_pipeline_stages Stages of the running plan.
# TYPE skyhive_pipeline_stages gauge
skyhive_pipeline_stages 2
# HELP skyhive_pipeline_workers Workers registered with the coordinator, by state (alive, dead).
# TYPE skyhive_pipeline_workers gauge
skyhive_pipeline_workers{state="alive"} 2
skyhive_pipeline_workers{state="dead"} 1
# HELP skyhive_train_samples_total Training examples processed (images, or sequences of a language model); rate() of it is the current throughput.
# TYPE skyhive_train_samples_total counter
skyhive_train_samples_total 64
# HELP skyhive_train_loss Training loss of the last step (cross-entropy per example, or per token for a language model).
# TYPE skyhive_train_loss gauge
skyhive_train_loss 2.25
# HELP skyhive_train_accuracy Training accuracy of the last step's batch (fraction of labels predicted), where the loop measures it.
# TYPE skyhive_train_accuracy gauge
skyhive_train_accuracy 0.5
`
	names := []string{"skyhive_pipeline_iterations_total", "skyhive_pipeline_plan_generation", "skyhive_pipeline_replans_total",
		"skyhive_pipeline_stage_compute_seconds_total", "skyhive_pipeline_stage_idle_seconds_total", "skyhive_pipeline_stages",
		"skyhive_pipeline_workers", "skyhive_train_samples_total", "skyhive_train_loss", "skyhive_train_accuracy"}
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), names...); err != nil {
		t.Error(err)
	}
	if n, _ := testutil.GatherAndCount(reg, "skyhive_pipeline_stage_communication_seconds_total", "skyhive_pipeline_iteration_duration_seconds"); n != 3 {
		t.Errorf("%d communication and duration series, want 3", n)
	}
	if problems, err := testutil.GatherAndLint(reg); err != nil || len(problems) > 0 {
		t.Errorf("lint: %v %v", problems, err)
	}
	m.close()
	if n, _ := testutil.GatherAndCount(reg); n != 0 {
		t.Errorf("%d metrics after close, want 0", n)
	}
}

func TestWorkerMetrics(t *testing.T) {
	reg := prometheus.NewRegistry()
	m, err := newWorkerMetrics(reg)
	if err != nil {
		t.Fatal(err)
	}
	if v := testutil.ToFloat64(prometheus.CollectorFunc(func(ch chan<- prometheus.Metric) {
		ch <- prometheus.MustNewConstMetric(pipeWorkerStageDesc, prometheus.GaugeValue, float64(m.stage.Load()))
	})); v != -1 {
		t.Errorf("stage %v before any iteration, want -1", v)
	}
	m.iteration(2, iterResp{Compute: 0.5, Comm: 0.25, Idle: 0.125}, nil)
	m.iteration(2, iterResp{}, errors.New("aborted"))
	want := `
# HELP skyhive_pipeline_worker_stage Stage this worker ran its last iteration as (-1: none yet).
# TYPE skyhive_pipeline_worker_stage gauge
skyhive_pipeline_worker_stage 2
# HELP skyhive_pipeline_worker_iterations_total Iterations this worker ran to the end of its schedule.
# TYPE skyhive_pipeline_worker_iterations_total counter
skyhive_pipeline_worker_iterations_total 1
# HELP skyhive_pipeline_worker_iteration_errors_total Iterations this worker could not finish (a neighbour failed, an abort, a timeout).
# TYPE skyhive_pipeline_worker_iteration_errors_total counter
skyhive_pipeline_worker_iteration_errors_total 1
# HELP skyhive_pipeline_worker_compute_seconds_total Compute time of this worker's iterations: forward and backward passes, emulated slowdown included.
# TYPE skyhive_pipeline_worker_compute_seconds_total counter
skyhive_pipeline_worker_compute_seconds_total 0.5
# HELP skyhive_pipeline_worker_communication_seconds_total Time this worker spent sending activations or gradients.
# TYPE skyhive_pipeline_worker_communication_seconds_total counter
skyhive_pipeline_worker_communication_seconds_total 0.25
# HELP skyhive_pipeline_worker_idle_seconds_total Time this worker waited for its neighbours' activations or gradients.
# TYPE skyhive_pipeline_worker_idle_seconds_total counter
skyhive_pipeline_worker_idle_seconds_total 0.125
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want)); err != nil {
		t.Error(err)
	}
	if problems, err := testutil.GatherAndLint(reg); err != nil || len(problems) > 0 {
		t.Errorf("lint: %v %v", problems, err)
	}
}

// A session on in-process workers reports through its coordinator's and
// its workers' collectors.
func TestPipelineSessionMetrics(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	net := memnet.NewNetwork()
	defer net.Close()
	peer := func() *memnet.Peer {
		p, err := net.NewPeer()
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	creg := prometheus.NewRegistry()
	c, err := NewCoordinator(ctx, CoordinatorConfig{Transport: peer(), Metrics: creg})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()
	wregs := []*prometheus.Registry{prometheus.NewRegistry(), prometheus.NewRegistry()}
	for i, reg := range wregs {
		w, err := NewWorker(ctx, WorkerConfig{Name: fmt.Sprintf("w%d", i), Join: c.Addrs()[0], Transport: peer(), Heartbeat: 200 * time.Millisecond, Metrics: reg})
		if err != nil {
			t.Fatal(err)
		}
		defer w.Close()
		wg.Go(func() { w.Run(ctx) })
		wctx, wcancel := context.WithTimeout(ctx, 10*time.Second)
		err = c.WaitWorkers(wctx, i+1)
		wcancel()
		if err != nil {
			t.Fatal(err)
		}
	}
	s, err := c.Start(ctx, SessionConfig{Model: "deep-mlp:32x2", Seed: 3, Batch: 16, Micro: 2, Schedule: GPipe,
		Optim: OptimConfig{LR: 1e-3}, Strategy: "even", ProfileReps: 1, IterTimeout: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	for _, b := range batches(t, blobs(t, 64, 1), 16, 3) {
		if _, err := s.Step(ctx, b); err != nil {
			t.Fatal(err)
		}
	}
	val := func(g prometheus.Gatherer, name string) float64 {
		t.Helper()
		fams, err := g.Gather()
		if err != nil {
			t.Fatal(err)
		}
		sum := 0.0
		for _, f := range fams {
			if f.GetName() == name {
				for _, m := range f.GetMetric() {
					sum += m.GetCounter().GetValue() + m.GetGauge().GetValue()
				}
			}
		}
		return sum
	}
	for name, want := range map[string]float64{
		"skyhive_pipeline_iterations_total": 3, "skyhive_pipeline_stages": 2, "skyhive_train_steps_total": 3,
		"skyhive_train_samples_total": 48, "skyhive_pipeline_workers": 2,
	} {
		if got := val(creg, name); got != want {
			t.Errorf("coordinator %s = %v, want %v", name, got, want)
		}
	}
	if v := val(creg, "skyhive_pipeline_stage_compute_seconds_total"); !(v > 0) {
		t.Errorf("stage compute %v, want > 0", v)
	}
	for i, reg := range wregs {
		if v := val(reg, "skyhive_pipeline_worker_iterations_total"); v != 3 {
			t.Errorf("worker %d: %v iterations, want 3", i, v)
		}
	}
}
