package pipeline

import (
	"encoding/json"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/skyhive/skyhive/alloc"
	"github.com/skyhive/skyhive/launch"
	"github.com/skyhive/skyhive/models"
	"github.com/skyhive/skyhive/netem"
	"github.com/skyhive/skyhive/node"
	"github.com/skyhive/skyhive/train"
)

// lmDataFields are the options of a language model's text.
var lmDataFields = []string{"corpus_bytes", "vocab", "seq", "token_width", "eval_tokens"}

// FromLaunch is the TrainConfig of a coordinator launched with a typed
// config (the flags of `skyhive train pipeline` or a config file), checked:
// TrainConfigFrom's options, those of the other kind of model than
// c.Model's refused, a language model's training options not given taking
// its registry defaults (models.ApplyDefaults), the initial plan read from
// the file c.Plan, the strategies of c.Compare, the local workers (their
// slowdowns, memory caps and emulated links) and the DHT peers of its status
// record. given reports whether the user gave an option, by its JSON name
// (data_dir). Errors about options are *launch.FieldError.
//
// The caller adds what needs its process: the coordinator's host
// (Scenario.Coordinator.Host), the binary of the local workers
// (Scenario.Binary), its output and its metrics.
func FromLaunch(c launch.Pipeline, given func(field string) bool) (TrainConfig, error) {
	cfg, err := TrainConfigFrom(c)
	if err != nil {
		return cfg, err
	}
	if !given("data") {
		cfg.Data = "" // the model's: fashion-mnist or gcide
	}
	if err := cfg.checkModel(given); err != nil {
		return cfg, err
	}
	if cfg.Plan, err = readPlan(c.Plan); err != nil {
		return cfg, err
	}
	if err := checkCompare(cfg.Compare, c.CompareRounds); err != nil {
		return cfg, err
	}
	if cfg.Scenario, err = scenarioFromLaunch(c); err != nil {
		return cfg, err
	}
	seeds, err := c.Net.Seeds()
	if err != nil {
		return cfg, err
	}
	cfg.Node = CoordinatorNode{DHT: node.BootstrapAddrs(seeds), StatusEvery: max(time.Duration(c.StatusEvery), 0)}
	return cfg, nil
}

// checkModel refuses the options of the other kind of model than cfg.Model's
// and gives a language model the registry's defaults (models.DefaultsOf)
// of the training options not given.
func (cfg *TrainConfig) checkModel(given func(string) bool) error {
	if !train.IsLanguageModel(cfg.Model) {
		for _, name := range lmDataFields {
			if given(name) {
				return launch.NewFieldError(nil, fmt.Sprintf("%%s is for language models; %s is an image classifier (language models: %s)", cfg.Model, models.LMUsage()), name)
			}
		}
		if cfg.Limit < 0 {
			return launch.NewFieldError(nil, fmt.Sprintf("%%s must not be negative, got %d", cfg.Limit), "limit")
		}
		return nil
	}
	dataset := cfg.Data
	if dataset == "" {
		dataset = "gcide"
	}
	for _, name := range []string{"epochs", "limit", "data_dir"} {
		if given(name) && train.IsTextData(dataset) {
			return launch.NewFieldError(nil, "%s is for image models; a language model trains for %s on %s "+dataset, name, "steps", "data")
		}
	}
	if strings.HasPrefix(dataset, "tokens:") && !given("vocab") {
		return launch.NewFieldError(nil, "%s "+dataset+": give the vocabulary of the token file with %s (50257 for GPT-2's tokenizer)", "data", "vocab")
	}
	if strings.Contains(cfg.Model, ":") && !given("seq") {
		cfg.Text.Seq = 0 // the spec's
	}
	d := models.ApplyDefaults(cfg.Model, given, models.TrainDefaults{Batch: cfg.Batch, LR: cfg.LR, Warmup: cfg.Warmup, ClipNorm: cfg.Clip})
	cfg.Batch, cfg.LR, cfg.Warmup, cfg.Clip = d.Batch, d.LR, d.Warmup, d.ClipNorm
	return nil
}

// readPlan reads the initial plan from the file at path; nil without one.
func readPlan(path string) (*alloc.Plan, error) {
	if path == "" {
		return nil, nil
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, launch.NewFieldError(err, "%s", "plan")
	}
	plan := &alloc.Plan{}
	if err := json.Unmarshal(b, plan); err != nil {
		return nil, launch.NewFieldError(err, "%s "+path, "plan")
	}
	return plan, nil
}

// checkCompare checks the strategies to compare, if any, and the rounds
// of each.
func checkCompare(strategies []string, rounds int) error {
	if strategies == nil {
		return nil
	}
	if rounds < 1 {
		return launch.NewFieldError(nil, fmt.Sprintf("%%s %d: want at least 1", rounds), "compare_rounds")
	}
	for _, name := range strategies {
		if !slices.Contains(alloc.StrategyNames(), name) {
			return launch.NewFieldError(nil, fmt.Sprintf("%%s: unknown strategy %q (want some of %s)", name, strings.Join(alloc.StrategyNames(), ", ")), "compare")
		}
	}
	return nil
}

// scenarioFromLaunch is the local workers of c.Workers: their slowdowns,
// memory caps and the emulated links of c.Regions or c.Latency between
// them.
func scenarioFromLaunch(c launch.Pipeline) (ScenarioConfig, error) {
	var cfg ScenarioConfig
	prof, regions, err := links(c)
	if err != nil {
		return cfg, err
	}
	if err := checkExecutor(c.Executor, c.Python, c.Device); err != nil {
		return cfg, err
	}
	if c.Workers > 0 {
		if cfg.Slowdowns, err = localSlowdowns(c); err != nil {
			return cfg, err
		}
		caps, err := parseList(c.MemCaps, func(s string) (int64, error) { return strconv.ParseInt(s, 10, 64) })
		if err != nil || (caps != nil && len(caps) != c.Workers) {
			return cfg, launch.NewFieldError(nil, fmt.Sprintf("%%s needs %d integers: %v", c.Workers, err), "mem_caps")
		}
		cfg.MemCaps = caps
		cfg.Worker.Executor, cfg.Worker.Python, cfg.Worker.Device = c.Executor, c.Python, c.Device
	}
	if prof == nil {
		return cfg, nil
	}
	return cfg, cfg.Emulate(prof, regions, c.CoordinatorRegion, c.Seed)
}

// links is the region profile of c.Regions or of c.Latency and
// c.Bandwidth (two regions a and b), and the regions of c.WorkerRegions;
// nil without emulation.
func links(c launch.Pipeline) (*netem.Profile, []string, error) {
	emulate := c.Latency != 0 || c.Bandwidth != 0
	regions, _ := parseList(c.WorkerRegions, func(s string) (string, error) { return s, nil })
	if regions != nil && len(regions) != c.Workers && (c.Regions != "" || emulate) {
		return nil, nil, launch.NewFieldError(nil, fmt.Sprintf("%%s has %d regions for %d workers", len(regions), c.Workers), "worker_regions")
	}
	switch {
	case c.Regions != "" && emulate:
		return nil, nil, launch.NewFieldError(nil, "use either %s or %s/%s", "regions", "latency", "bandwidth")
	case c.Regions != "":
		prof, err := netem.LoadProfile(c.Regions)
		if err != nil {
			return nil, nil, launch.NewFieldError(err, "%s", "regions")
		}
		return prof, regions, nil
	case emulate:
		if c.Latency < 0 || c.Bandwidth < 0 {
			return nil, nil, launch.NewFieldError(nil, "%s and %s must not be negative", "latency", "bandwidth")
		}
		inter := netem.LinkParams{Latency: time.Duration(c.Latency), Bandwidth: c.Bandwidth * 1e6}
		return &netem.Profile{Regions: []string{"a", "b"}, Intra: netem.LinkParams{Latency: 500 * time.Microsecond, Bandwidth: 1e9},
			Inter: [][]netem.LinkParams{{{}, inter}, {inter, {}}}}, regions, nil
	case c.WorkerRegions != "" || c.CoordinatorRegion != "":
		return nil, nil, launch.NewFieldError(nil, "%s and %s need %s or %s", "worker_regions", "coordinator_region", "regions", "latency")
	}
	return nil, nil, nil
}

// parseList parses the comma-separated values of s; nil if s is empty.
func parseList[T any](s string, parse func(string) (T, error)) ([]T, error) {
	if s == "" {
		return nil, nil
	}
	var out []T
	for f := range strings.SplitSeq(s, ",") {
		v, err := parse(strings.TrimSpace(f))
		if err != nil {
			return nil, err
		}
		out = append(out, v)
	}
	return out, nil
}

// localSlowdowns returns the slowdown of every local worker: c.Slowdowns,
// or draws from U[1, c.SlowdownMax] (LocalSlowdowns).
func localSlowdowns(c launch.Pipeline) ([]float64, error) {
	sl, err := parseList(c.Slowdowns, func(s string) (float64, error) { return strconv.ParseFloat(s, 64) })
	if err != nil {
		return nil, launch.NewFieldError(err, "%s", "slowdowns")
	}
	if sl != nil {
		if len(sl) != c.Workers {
			return nil, launch.NewFieldError(nil, fmt.Sprintf("%%s has %d values for %d workers", len(sl), c.Workers), "slowdowns")
		}
		return sl, nil
	}
	if c.SlowdownMax < 1 {
		return nil, launch.NewFieldError(nil, fmt.Sprintf("%%s must be at least 1, got %v", c.SlowdownMax), "slowdown_max")
	}
	return LocalSlowdowns(c.Workers, c.SlowdownMax, c.Seed), nil
}

// Defaults returns the coordinator's own options without any given, as
// `skyhive train pipeline` has them without flags, but for the model, the
// training, network, process and output options: the skyhive strategy
// under a 1F1B schedule of 4 micro-batches, re-planning at a 30% drift,
// snapshots and tables every 10 iterations, a minute per iteration before
// a stage counts as failed, 5 rounds per compared strategy, local workers
// at full speed and no failure drill.
func Defaults() launch.Pipeline {
	return launch.Pipeline{Strategy: "skyhive", Schedule: "1f1b", Micro: 4, ReplanThreshold: 0.3, CheckpointEvery: 10,
		IterTimeout: launch.Duration(time.Minute), LogEvery: 10, KillWorker: -1, CompareRounds: 5, SlowdownMax: 1,
		Executor: ExecutorGo, Device: "auto"}
}

// WorkerDefaults returns a worker's own options without any given, as
// `skyhive worker` has them without flags, but for the network and process
// options: a device at full speed.
func WorkerDefaults() launch.Worker {
	return launch.Worker{Slowdown: 1, Executor: ExecutorGo, Device: "auto"}
}
