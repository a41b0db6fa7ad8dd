package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/spf13/pflag"

	"github.com/skyhive/skyhive/launch"
	"github.com/skyhive/skyhive/models"
	"github.com/skyhive/skyhive/pipeline"
)

// train pipeline on an image model compares the plans of --compare (15
// iterations: 7 calibrating the cost model, then two rounds of two plans,
// each installed and first run once unmeasured),
// trains on --strategy's plan up to --steps iterations in all, recovers
// from the failure drill's killed worker and prints its JSON result.
func TestTrainPipelineCompare(t *testing.T) {
	if testing.Short() {
		t.Skip("starts worker processes")
	}
	var stdout syncBuffer
	p := startCLI(t, &stdout, "train", "pipeline", "--workers", "3", "--slowdown-max", "3", "--data", "blobs", "--model", "deep-mlp:32x6",
		"--batch", "32", "--micro", "2", "--steps", "24", "--compare", "even,skyhive", "--compare-rounds", "2", "--strategy", "even",
		"--kill-worker", "1", "--kill-at", "20", "--log-every", "0", "--json")
	if err := p.wait(t, 3*time.Minute); err != nil {
		t.Fatalf("%v\n%s", err, tail(p.stderr.String()))
	}
	var res pipeline.RunResult
	if err := json.Unmarshal([]byte(stdout.String()), &res); err != nil {
		t.Fatalf("stdout is not the JSON result: %v\n%s\n%s", err, stdout.String(), tail(p.stderr.String()))
	}
	// The comparison: 2 + 5 calibration iterations, then two rounds of
	// two plans, each installed and run once unmeasured.
	if res.Iterations != 24 || res.Ran != 24-15 || len(res.Plan.Stages) == 0 || !(res.TestAccuracy > 0) {
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
	if len(res.Events) == 0 || !strings.Contains(p.stderr.String(), "failure drill: killing worker w1 before iteration 20") {
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
	var res pipeline.DemoResult
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

// Bad options of train pipeline are refused before any worker starts,
// naming the flag at fault.
func TestTrainPipelineBadFlags(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--compare", "even,bogus"}, `--compare: unknown strategy "bogus"`},
		{[]string{"--compare", "even", "--compare-rounds", "0"}, "--compare-rounds 0: want at least 1"},
		{[]string{"--slowdowns", "1,2,3"}, "--slowdowns has 3 values for 2 workers"},
		{[]string{"--slowdown-max", "0.5"}, "--slowdown-max must be at least 1"},
		{[]string{"--mem-caps", "1,x"}, "--mem-caps needs 2 integers"},
		{[]string{"--regions", "x.json", "--latency", "10ms"}, "use either --regions or --latency/--bandwidth"},
		{[]string{"--worker-regions", "a,b"}, "--worker-regions and --coordinator-region need --regions or --latency"},
		{[]string{"--latency", "10ms", "--worker-regions", "a"}, "--worker-regions has 1 regions for 2 workers"},
		{[]string{"--plan", filepath.Join(t.TempDir(), "none.json")}, "--plan: "},
		{[]string{"--schedule", "zigzag"}, "zigzag"},
	} {
		var out syncBuffer
		err := runCLI(context.Background(), &out, append([]string{"train", "pipeline", "--workers", "2"}, tc.args...)...)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: %v, want an error about %q", tc.args, err, tc.want)
		}
	}
}

// A pipeline coordinator's config file is its typed config: the fields it
// gives count as given flags, those of the other kind of model and the
// ones the role lacks are refused, and its values are checked as the
// flags' are.
func TestPipelineRoleFile(t *testing.T) {
	dir := t.TempDir()
	for i, tc := range []struct {
		config launch.Pipeline
		body   string // instead of config
		want   string
	}{
		{config: launch.Pipeline{Workers: 2, Slowdowns: "1,2,3"}, want: "--slowdowns has 3 values for 2 workers"},
		{config: launch.Pipeline{Model: "mlp", Workers: 2, Training: launch.Training{Vocab: 300}}, want: "--vocab is for language models"},
		{config: launch.Pipeline{Model: "gpt-mini", Workers: 2, Training: launch.Training{Data: "text:x.txt", Steps: 5, Epochs: 2}}, want: "--epochs is for image models"},
		{config: launch.Pipeline{Model: "gpt-mini", Workers: 2, Training: launch.Training{Data: "tokens:x.bin", Steps: 5}}, want: "give the vocabulary of the token file with --vocab"},
		{config: launch.Pipeline{Model: "gpt-mini", Workers: 2, Training: launch.Training{Data: "fashion-mnist", Steps: 5}}, want: "train it on text"},
		{config: launch.Pipeline{}, want: "train pipeline needs --workers N"},
		{body: `{"role": "train-pipeline", "config": {"workers": 2, "region": "eu"}}`, want: `"region" is not an option of this role`},
		{body: `{"role": "train-pipeline", "config": {"workers": 2, "slowdown": 2}}`, want: `unknown field "slowdown"`},
	} {
		path := filepath.Join(dir, fmt.Sprintf("c%d.json", i))
		if tc.body != "" {
			if err := os.WriteFile(path, []byte(tc.body), 0o600); err != nil {
				t.Fatal(err)
			}
		} else if err := launch.Write(path, tc.config); err != nil {
			t.Fatal(err)
		}
		var out syncBuffer
		if err := runRoleFile(context.Background(), path, &out, &out); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%d: got %v, want an error containing %q", i, err, tc.want)
		}
	}
}

// The flags of train pipeline and a config file of the same options give
// the same pipeline config, the model's defaults of the options not given
// included.
func TestPipelineFlagsAndFileAgree(t *testing.T) {
	path := filepath.Join(t.TempDir(), "coord.json")
	if err := launch.Write(path, launch.Pipeline{Model: "gpt-mini", Workers: 2, Strategy: "even",
		Training: launch.Training{Data: "text:x.txt", Steps: 5, Seq: 16}}); err != nil {
		t.Fatal(err)
	}
	f, err := launch.Read(path)
	if err != nil {
		t.Fatal(err)
	}
	c := pipelineDefaults()
	given, err := pipeline.DecodeLaunch(f, &c)
	if err != nil {
		t.Fatal(err)
	}
	fromFile, err := pipelineConfig(c, given)
	if err != nil {
		t.Fatal(err)
	}
	var p pipelineFlags
	fl := pflag.NewFlagSet("train pipeline", pflag.ContinueOnError)
	p.register(fl)
	if err := fl.Parse([]string{"--model", "gpt-mini", "--workers", "2", "--strategy", "even", "--data", "text:x.txt", "--steps", "5", "--seq", "16"}); err != nil {
		t.Fatal(err)
	}
	fromFlags, err := pipelineConfig(p.config(), func(f string) bool { return fl.Changed(strings.ReplaceAll(f, "_", "-")) })
	if err != nil {
		t.Fatal(err)
	}
	fromFile.Scenario.Slowdowns, fromFlags.Scenario.Slowdowns = nil, nil
	if !reflect.DeepEqual(fromFile, fromFlags) {
		t.Fatalf("from the file:\n%+v\nfrom the flags:\n%+v", fromFile, fromFlags)
	}
	if d := models.DefaultsOf("gpt-mini"); fromFlags.Batch != d.Batch || fromFlags.LR != d.LR || fromFlags.Text.Seq != 16 || fromFlags.Data != "text:x.txt" {
		t.Fatalf("config %+v: want the model's batch %d and lr %v, --seq 16 and --data text:x.txt", fromFlags, d.Batch, d.LR)
	}
}

// The coordinator's and the worker's own options default to the
// library's (pipeline.Defaults, pipeline.WorkerDefaults), so that a config
// file and the flags agree.
func TestPipelineFlagsDefaultToLibrary(t *testing.T) {
	got, want := pipelineDefaults(), pipeline.Defaults()
	got.Net, got.Process, got.Output, got.Training = launch.Net{}, launch.Process{}, launch.Output{}, launch.Training{}
	got.Model = ""
	if !reflect.DeepEqual(got, want) {
		t.Errorf("flags give %+v, pipeline.Defaults %+v", got, want)
	}
	w := workerDefaults()
	w.Net, w.Process = launch.Net{}, launch.Process{}
	if want := pipeline.WorkerDefaults(); !reflect.DeepEqual(w, want) {
		t.Errorf("flags give %+v, pipeline.WorkerDefaults %+v", w, want)
	}
}
