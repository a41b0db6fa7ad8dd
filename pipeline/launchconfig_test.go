package pipeline

import (
	"errors"
	"io"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/skyhive/skyhive/launch"
	"github.com/skyhive/skyhive/models"
	"github.com/skyhive/skyhive/p2p"
)

// given is a FromLaunch given: the options named.
func given(names ...string) func(string) bool {
	return func(f string) bool { return slices.Contains(names, f) }
}

// FromLaunch refuses bad options with a *launch.FieldError naming their
// JSON fields.
func TestFromLaunchNamesFields(t *testing.T) {
	ok := launch.Pipeline{Model: "mlp", Workers: 2, Schedule: "1f1b", Micro: 2, SlowdownMax: 1, CompareRounds: 1,
		Training: launch.Training{Epochs: 1, Batch: 32, LR: 1e-3}}
	for _, tc := range []struct {
		edit   func(*launch.Pipeline)
		given  []string
		fields []string
	}{
		{func(c *launch.Pipeline) { c.Workers = 0 }, nil, []string{"workers", "join_wait"}},
		{func(c *launch.Pipeline) { c.Slowdowns = "1,2,3" }, nil, []string{"slowdowns"}},
		{func(c *launch.Pipeline) { c.SlowdownMax = 0.5 }, nil, []string{"slowdown_max"}},
		{func(c *launch.Pipeline) { c.MemCaps = "1,x" }, nil, []string{"mem_caps"}},
		{func(c *launch.Pipeline) { c.Compare = "even,bogus" }, nil, []string{"compare"}},
		{func(c *launch.Pipeline) { c.Compare, c.CompareRounds = "even", 0 }, nil, []string{"compare_rounds"}},
		{func(c *launch.Pipeline) { c.Regions, c.Latency = "x.json", launch.Duration(time.Millisecond) }, nil, []string{"regions", "latency", "bandwidth"}},
		{func(c *launch.Pipeline) { c.WorkerRegions = "a,b" }, nil, []string{"worker_regions", "coordinator_region", "regions", "latency"}},
		{func(c *launch.Pipeline) { c.Latency, c.WorkerRegions = launch.Duration(time.Millisecond), "a" }, nil, []string{"worker_regions"}},
		{func(c *launch.Pipeline) { c.Plan = "/no/such/plan.json" }, nil, []string{"plan"}},
		{func(c *launch.Pipeline) { c.Vocab = 300 }, []string{"vocab"}, []string{"vocab"}},
		{func(c *launch.Pipeline) { c.Model, c.Data, c.Steps = "gpt-mini", "text:x.txt", 5 }, []string{"data", "epochs"}, []string{"epochs", "steps", "data"}},
		{func(c *launch.Pipeline) { c.Model, c.Data, c.Steps = "gpt-mini", "tokens:x.bin", 5 }, []string{"data"}, []string{"data", "vocab"}},
		{func(c *launch.Pipeline) { c.Executor = "java" }, nil, []string{"executor"}},
		{func(c *launch.Pipeline) { c.Device = "cuda" }, nil, []string{"device"}},
		{func(c *launch.Pipeline) { c.Executor, c.Python = "go", "/usr/bin/python3" }, nil, []string{"python"}},
	} {
		c := ok
		tc.edit(&c)
		_, err := FromLaunch(c, given(tc.given...))
		var fe *launch.FieldError
		if !errors.As(err, &fe) || !slices.Equal(fe.Fields, tc.fields) {
			t.Errorf("%+v: got %v, want a field error about %v", c, err, tc.fields)
		}
	}
}

// A language model takes its registry defaults of the training options
// not given, and the local workers get their slowdowns and emulated
// links.
func TestFromLaunch(t *testing.T) {
	c := launch.Pipeline{Model: "gpt-mini", Workers: 3, Schedule: "1f1b", Micro: 2, SlowdownMax: 2, Strategy: "even",
		Training: launch.Training{Epochs: 1, Batch: 128, LR: 1e-3, Warmup: 200, Clip: 5, Data: "text:x.txt", Steps: 5, Seq: 16,
			Latency: launch.Duration(10 * time.Millisecond), Bandwidth: 50}}
	cfg, err := FromLaunch(c, given("data", "steps", "seq", "lr"))
	if err != nil {
		t.Fatal(err)
	}
	d := models.DefaultsOf("gpt-mini")
	if cfg.Batch != d.Batch || cfg.LR != 1e-3 || cfg.Warmup != d.Warmup || cfg.Clip != d.ClipNorm || cfg.Text.Seq != 16 || cfg.Data != "text:x.txt" {
		t.Errorf("config %+v: want the model's batch, warm-up and clip, lr 1e-3 and seq 16", cfg)
	}
	sc := cfg.Scenario
	if len(sc.Slowdowns) != 3 || sc.Coordinator.Network == nil || !slices.Equal(sc.Regions, []string{"a", "b", "a"}) {
		t.Errorf("scenario %+v: want 3 local workers in regions a, b, a", sc)
	}
	c.Executor, c.Device = ExecutorPython, "cpu"
	if cfg, err := FromLaunch(c, given("data", "steps", "seq", "lr")); err != nil || cfg.Scenario.Worker.Executor != ExecutorPython || cfg.Scenario.Worker.Device != "cpu" {
		t.Errorf("--executor python --device cpu: local workers %+v, %v", cfg.Scenario.Worker, err)
	}
	c.Executor, c.Device = "", ""
	if cfg, err := FromLaunch(c, given("steps")); err != nil || cfg.Data != "" {
		t.Errorf("data not given: %q, %v; want the model's", cfg.Data, err)
	}
}

// Check refuses a demo config it cannot run, naming the options.
func TestDemoConfigCheck(t *testing.T) {
	ok := DemoConfig{Workers: 2, SlowdownMax: 1, Batch: 8, Micro: 2, Steps: 1, CompareIters: 5}
	if err := ok.Check(); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		edit   func(*DemoConfig)
		fields []string
	}{
		{func(c *DemoConfig) { c.Workers = 1 }, []string{"workers"}},
		{func(c *DemoConfig) { c.Micro = 0 }, []string{"steps", "batch", "micro"}},
		{func(c *DemoConfig) { c.CompareIters = 4 }, []string{"compare_iters"}},
		{func(c *DemoConfig) { c.Limit = -1 }, []string{"limit"}},
		{func(c *DemoConfig) { c.SlowdownMax = 0.5 }, []string{"slowdown_max"}},
	} {
		c := ok
		tc.edit(&c)
		var fe *launch.FieldError
		if err := c.Check(); !errors.As(err, &fe) || !slices.Equal(fe.Fields, tc.fields) {
			t.Errorf("%+v: got %v, want a field error about %v", c, err, tc.fields)
		}
	}
}

// A worker role refuses executor options it cannot use before starting
// anything.
func TestWorkerRoleExecutorOptions(t *testing.T) {
	for _, tc := range []struct {
		w    launch.Worker
		want string
	}{
		{launch.Worker{Join: "x", Executor: "java"}, `executor "java": want go or python`},
		{launch.Worker{Join: "x", Device: "cuda"}, "device is an option of the PyTorch executor"},
		{launch.Worker{Join: "x", Executor: ExecutorPython}, "cannot start a PyTorch executor"},
	} {
		err := RunWorkerRole(t.Context(), tc.w, p2p.Config{}, io.Discard, nil)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: %v, want %q", tc.w, err, tc.want)
		}
	}
}
