package main

import (
	"bytes"
	"context"
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"

	"github.com/skyhive/skyhive/alloc"
	"github.com/skyhive/skyhive/profile"
)

// planRunCLI runs the root command with args and returns stdout and the error.
func planRunCLI(t *testing.T, args ...string) (string, error) {
	t.Helper()
	root := newRootCmd()
	var out, errOut bytes.Buffer
	root.SetOut(&out)
	root.SetErr(&errOut)
	root.SetArgs(args)
	err := root.ExecuteContext(context.Background())
	return out.String(), err
}

func planExample(name string) string { return filepath.Join("..", "..", "examples", name) }

func TestPlanAllStrategies(t *testing.T) {
	out, err := planRunCLI(t, "plan", "--cluster", planExample("cluster-hetero.json"), "--model", "bert-large:48", "--time-limit", "2s")
	if err != nil {
		t.Fatalf("plan: %v\n%s", err, out)
	}
	for _, want := range []string{"== even ==", "== sky ==", "== optimal ==", "== skyhive ==", "× over even", "summary", "STAGE"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
}

func TestPlanJSON(t *testing.T) {
	out, err := planRunCLI(t, "plan", "--cluster", planExample("cluster-geo.json"), "--model", "bert-large:64",
		"--strategy", "skyhive", "--schedule", "gpipe", "--micro-batches", "8", "--json")
	if err != nil {
		t.Fatalf("plan: %v", err)
	}
	var got alloc.PlanJSON
	if err := json.Unmarshal([]byte(out), &got); err != nil {
		t.Fatalf("bad JSON: %v\n%s", err, out)
	}
	if got.MicroBatches != 8 || got.Layers != 64 || len(got.Results) != 2 || len(got.Errors) != 0 {
		t.Fatalf("unexpected result: %+v", got)
	}
	even, sky := got.Results[0], got.Results[1]
	if even.Strategy != "even" || !even.Baseline || sky.Strategy != "skyhive" || sky.Baseline {
		t.Fatalf("results %q (baseline %v), %q", even.Strategy, even.Baseline, sky.Strategy)
	}
	if !(sky.Predicted > 0) || sky.Predicted > even.Predicted || sky.SpeedupOnEven < 1 {
		t.Errorf("skyhive %g s vs even %g s, speedup %g", sky.Predicted, even.Predicted, sky.SpeedupOnEven)
	}
	layers := 0
	for _, s := range sky.Stages {
		layers += s.Last - s.First
	}
	if layers != 64 {
		t.Errorf("stages cover %d layers", layers)
	}
}

func TestPlanInfeasible(t *testing.T) {
	out, err := planRunCLI(t, "plan", "--cluster", planExample("cluster-geo.json"), "--model", "bert-large:800", "--strategy", "skyhive")
	if err == nil {
		t.Fatal("infeasible plan succeeded")
	}
	if !strings.Contains(err.Error(), "need 67.7 GiB more") || !strings.Contains(out, "short by 67.7 GiB") {
		t.Errorf("error %q, output:\n%s", err, out)
	}
}

func TestPlanFlagErrors(t *testing.T) {
	for _, args := range [][]string{
		{"plan", "--model", "bert-large:8"},
		{"plan", "--cluster", planExample("cluster-geo.json"), "--strategy", "fastest"},
		{"plan", "--cluster", planExample("cluster-geo.json"), "--schedule", "gpipe"},
		{"plan", "--cluster", planExample("cluster-geo.json"), "--schedule", "sequential", "--micro-batches", "4"},
		{"plan", "--cluster", planExample("cluster-geo.json"), "--schedule", "1f1b"},
		{"plan", "--cluster", planExample("cluster-geo.json"), "--model", planExample("model-mlp.json"), "--batch", "8"},
		{"plan", "--cluster", "missing.json"},
	} {
		if _, err := planRunCLI(t, args...); err == nil {
			t.Errorf("%v succeeded", args)
		}
	}
}

func TestProfileModelThenPlan(t *testing.T) {
	dir := t.TempDir()
	mpath := filepath.Join(dir, "model.json")
	out, err := planRunCLI(t, "profile", "model", "--model", "bert-large:12", "--batch", "16", "--out", mpath)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out, "11.enc") || !strings.Contains(out, "total") {
		t.Errorf("layer table:\n%s", out)
	}
	mp, err := profile.LoadModel(mpath)
	if err != nil || len(mp.Layers) != 12 || mp.Batch != 16 {
		t.Fatalf("saved profile: %+v, %v", mp, err)
	}
	out, err = planRunCLI(t, "plan", "--cluster", planExample("cluster-hetero.json"), "--model", mpath, "--strategy", "sky")
	if err != nil || !strings.Contains(out, "== sky ==") {
		t.Errorf("plan on a model profile: %v\n%s", err, out)
	}

	out, err = planRunCLI(t, "profile", "model", "--model", "mlp", "--batch", "8", "--measure", "--reps", "1", "--json")
	if err != nil {
		t.Fatal(err)
	}
	var got profile.ModelProfile
	if err := json.Unmarshal([]byte(out), &got); err != nil || !got.Measured() || got.Format != profile.ModelFormat {
		t.Errorf("model JSON: %v\n%s", err, out)
	}
}

func TestProfileDeviceAndCluster(t *testing.T) {
	dir := t.TempDir()
	var paths []string
	for _, name := range []string{"a", "b"} {
		p := filepath.Join(dir, name+".json")
		_, err := planRunCLI(t, "profile", "device", "--name", name, "--region", "r-"+name, "--tokens", "64", "--hidden", "64",
			"--mem-cap-gib", "2", "--slowdown", "2", "--out", p)
		if err != nil {
			t.Fatal(err)
		}
		paths = append(paths, p)
	}
	cpath := filepath.Join(dir, "cluster.json")
	if _, err := planRunCLI(t, append([]string{"profile", "cluster", "--out", cpath, "--inter-latency-ms", "20"}, paths...)...); err != nil {
		t.Fatal(err)
	}
	c, err := profile.LoadCluster(cpath)
	if err != nil {
		t.Fatal(err)
	}
	if len(c.Devices) != 2 || c.Devices[0].MemBytes != 2<<30 || c.Link(0, 1).Latency != 0.02 {
		t.Errorf("cluster %+v, link %+v", c.Devices, c.Link(0, 1))
	}
	out, err := planRunCLI(t, "plan", "--cluster", cpath, "--model", "bert-base:2", "--batch", "1", "--strategy", "even")
	if err != nil || !strings.Contains(out, "== even ==") {
		t.Errorf("plan on a cluster profile: %v\n%s", err, out)
	}
}
