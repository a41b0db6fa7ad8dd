package main

import (
	"encoding/json"
	"strings"
	"testing"
	"time"
)

// train pipeline on an image model compares the plans of --compare (6
// iterations: two rounds of two plans, each first run once unmeasured),
// trains on --strategy's plan up to --steps iterations in all, recovers
// from the failure drill's killed worker and prints its JSON result.
func TestTrainPipelineCompare(t *testing.T) {
	if testing.Short() {
		t.Skip("starts worker processes")
	}
	var stdout syncBuffer
	p := startCLI(t, &stdout, "train", "pipeline", "--workers", "3", "--slowdown-max", "3", "--data", "blobs", "--model", "deep-mlp:32x6",
		"--batch", "32", "--micro", "2", "--steps", "12", "--compare", "even,skyhive", "--compare-rounds", "2", "--strategy", "even",
		"--kill-worker", "1", "--kill-at", "8", "--log-every", "0", "--json")
	if err := p.wait(t, 3*time.Minute); err != nil {
		t.Fatalf("%v\n%s", err, tail(p.stderr.String()))
	}
	var res pipelineResult
	if err := json.Unmarshal([]byte(stdout.String()), &res); err != nil {
		t.Fatalf("stdout is not the JSON result: %v\n%s\n%s", err, stdout.String(), tail(p.stderr.String()))
	}
	if res.Iterations != 12 || res.Ran != 6 || len(res.Plan.Stages) == 0 || !(res.TestAccuracy > 0) {
		t.Fatalf("result %+v", res)
	}
	if len(res.Compare) != 2 || res.Compare[0].Strategy != "even" || res.Compare[1].Strategy != "skyhive" {
		t.Fatalf("compared %+v, want even and skyhive", res.Compare)
	}
	for _, m := range res.Compare {
		if len(m.Times) != 2 || !(m.Median > 0) || !(m.Predicted > 0) {
			t.Errorf("%s measured %+v", m.Strategy, m)
		}
	}
	if len(res.Events) == 0 || !strings.Contains(p.stderr.String(), "failure drill: killing worker w1 before iteration 8") {
		t.Errorf("no recovery from the failure drill: events %v\n%s", res.Events, tail(p.stderr.String()))
	}
	if !strings.Contains(p.stderr.String(), "comparing plans of even,skyhive: 2 measured iterations each") {
		t.Errorf("the log does not announce the comparison:\n%s", tail(p.stderr.String()))
	}
}

// skyhive demo launches its workers, compares the plans of every
// strategy, measures even, sky and skyhive, and trains with the skyhive
// plan.
func TestDemoPipeline(t *testing.T) {
	if testing.Short() {
		t.Skip("starts worker processes")
	}
	if !fashionMNISTInstalled() {
		t.Skip("Fashion-MNIST is not installed")
	}
	var stdout syncBuffer
	p := startCLI(t, &stdout, "demo", "--workers", "2", "--model", "deep-mlp:32x4", "--batch", "32", "--steps", "3",
		"--compare-iters", "5", "--limit", "512", "--json")
	if err := p.wait(t, 3*time.Minute); err != nil {
		t.Fatalf("%v\n%s", err, tail(p.stderr.String()))
	}
	var res demoResult
	if err := json.Unmarshal([]byte(stdout.String()), &res); err != nil {
		t.Fatalf("stdout is not the JSON result: %v\n%s\n%s", err, stdout.String(), tail(p.stderr.String()))
	}
	if res.Iterations != 3 || len(res.Plan.Stages) == 0 || !(res.TestAccuracy > 0) || !(res.SamplesPerS > 0) {
		t.Fatalf("result %+v", res)
	}
	var names []string
	for _, c := range res.Compared {
		names = append(names, c.Strategy)
		if !(c.MedianSeconds > 0) || c.MinSeconds > c.MedianSeconds || !(c.PredictSeconds > 0) || !(c.SpeedupOnEven > 0) {
			t.Errorf("%s: %+v", c.Strategy, c)
		}
	}
	if strings.Join(names, ",") != "even,sky,skyhive" {
		t.Errorf("compared %v, want even, sky and skyhive", names)
	}
	for _, want := range []string{"STRATEGY  PLAN", "optimal", "3/4 measuring each plan for 5 iterations", "4/4 training"} {
		if !strings.Contains(p.stderr.String(), want) {
			t.Errorf("the log has no %q:\n%s", want, tail(p.stderr.String()))
		}
	}
}
