package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
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
	"github.com/skyhive/skyhive/p2p"
	"github.com/skyhive/skyhive/pipeline"
	"github.com/skyhive/skyhive/train"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

// pipelineFlags are the options of `skyhive train pipeline`: those of the
// coordinator's own bound to its typed config, and the shared groups.
type pipelineFlags struct {
	c      launch.Pipeline
	train  trainFlags
	net    connectFlags
	link   linkFlags
	status statusFlags
}

func newTrainPipelineCmd() *cobra.Command {
	var p pipelineFlags
	cmd := &cobra.Command{
		Use:   "pipeline",
		Short: "Train a model as a load-balanced pipeline of stage workers (local processes or joined machines)",
		Long: "Coordinate a pipeline: profile the workers and the model's layers, assign contiguous\n" +
			"layers with --strategy, train with the --schedule over libp2p, snapshot the stages every\n" +
			"--checkpoint-every iterations, re-plan when a worker fails or its speed drifts, and\n" +
			"evaluate at the end. --workers N starts local `skyhive worker` processes; --join-wait N\n" +
			"waits for workers on other machines (it prints the `skyhive worker --join` command).\n" +
			"--regions or --latency/--bandwidth emulate wide-area links between local workers. With\n" +
			"local workers only (no --join-wait) the coordinator listens on loopback unless --listen says\n" +
			"otherwise; with --join-wait it prints where workers reach it and whether they can.",
		Example: "  skyhive train pipeline --workers 4 --slowdown-max 3 --strategy skyhive --steps 300\n" +
			"  skyhive train pipeline --workers 3 --model gpt-mini --data gcide --steps 200\n" +
			"  skyhive train pipeline --workers 4 --model deep-mlp:128x8 --latency 100ms --bandwidth 50\n" +
			"  skyhive train pipeline --listen /ip4/0.0.0.0/tcp/4001 --identity coord.key --join-wait 4",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return runPipelineRole(cmd.Context(), cmd.OutOrStdout(), cmd.ErrOrStderr(), p.config(), cmd.Flags().Changed)
		},
	}
	cmd.PreRunE = checkedNumbers(numberRules{Positive: []string{"epochs", "batch", "lr"}, Negative: []string{"kill-worker"}})
	p.register(cmd.Flags())
	return cmd
}

// register adds the flags of `skyhive train pipeline`, with their defaults.
func (p *pipelineFlags) register(fl *pflag.FlagSet) {
	c := &p.c
	p.train.register(fl)
	p.train.registerModel(fl, "fashion-mnist or blobs; language models: "+train.TextDataUsage+", default gcide")
	fl.Lookup("model").Usage = "model: " + models.Usage() + "; or a language model: " + models.LMUsage() + " (a size without parameters, gpt-mini, takes --vocab and --seq)"
	p.train.lm.lmDataFlags.register(fl, 0)
	p.train.out.register(fl, "the result (plan, workers, events, last iteration)", "one per iteration, with per-stage times")
	fl.IntVar(&p.train.steps, "steps", 0, "stop after N iterations (0: --epochs)")
	fl.IntVar(&c.Workers, "workers", 0, "launch N local skyhive worker processes on loopback")
	fl.StringVar(&c.Slowdowns, "slowdowns", "", "comma-separated slowdown factor per local worker")
	fl.Float64Var(&c.SlowdownMax, "slowdown-max", 1, "draw local workers' slowdowns from U[1,MAX] (seeded by --seed)")
	fl.StringVar(&c.MemCaps, "mem-caps", "", "comma-separated memory cap in bytes per local worker")
	fl.IntVar(&c.JoinWait, "join-wait", 0, "wait for N external workers to join (skyhive worker --join ADDR)")
	p.net.register(fl, "DHT peers of a swarm to publish this coordinator's status record (stages, plan, loss) through, for skyhive status and skyhive dashboard (optional: the pipeline does not need a DHT)")
	p.status.registerEvery(fl)
	fl.StringVar(&c.Plan, "plan", "", "fixed initial plan JSON {\"stages\":[{\"device\":0,\"first\":0,\"last\":4},...]}")
	fl.StringVar(&c.Strategy, "strategy", "skyhive", "allocation strategy ("+strings.Join(alloc.StrategyNames(), ", ")+")")
	fl.StringVar(&c.Schedule, "schedule", "1f1b", "schedule (sequential, gpipe, 1f1b)")
	fl.IntVar(&c.Micro, "micro", 4, "micro-batches per batch (gpipe, 1f1b)")
	fl.Float64Var(&c.ReplanThreshold, "replan-threshold", 0.3, "re-plan when a stage's speed drifts by this fraction (0: only on failures)")
	fl.IntVar(&c.CheckpointEvery, "checkpoint-every", 10, "snapshot all stages every N iterations")
	fl.DurationVar(durationVar(&c.IterTimeout), "iter-timeout", time.Minute, "a stage that does not finish an iteration in time counts as failed")
	fl.IntVar(&c.LogEvery, "log-every", 10, "print the per-stage breakdown every N iterations")
	fl.IntVar(&c.KillWorker, "kill-worker", -1, "failure drill: SIGKILL local worker wK ...")
	fl.IntVar(&c.KillAt, "kill-at", 0, "... before iteration N")
	fl.StringVar(&c.Regions, "regions", "", "emulate the links between local workers with this netem region profile (e.g. examples/regions.json)")
	fl.StringVar(&c.WorkerRegions, "worker-regions", "", "comma-separated region per local worker (default: round-robin over the profile's regions)")
	fl.StringVar(&c.CoordinatorRegion, "coordinator-region", "", "the coordinator's region (default: the profile's first)")
	p.link.register(fl, "between two regions a and b of local workers (instead of --regions)", 0)
	fl.StringVar(&c.Compare, "compare", "", "before training, measure the iteration time of these strategies' plans in turn (e.g. even,skyhive), then train with --strategy")
	fl.IntVar(&c.CompareRounds, "compare-rounds", 5, "measured iterations per strategy of --compare (alternating, after one warm-up each)")
	p.train.metrics.register(fl)
	renameFlags(fl, map[string]string{"link-latency": "latency", "link-bandwidth": "bandwidth", "micro-batches": "micro"})
}

// config is the coordinator's typed config the flags give.
func (p *pipelineFlags) config() launch.Pipeline {
	c, f, l := p.c, &p.train, p.train.lm
	c.Net = p.net.launchNet()
	c.Process = p.status.process(f.metrics.addr) // no --region: the coordinator has none
	c.Output = launch.Output{JSON: f.out.json, Stats: f.out.stats}
	c.Training = launch.Training{Epochs: f.cfg.Epochs, Batch: f.cfg.BatchSize, LR: f.cfg.LR, WeightDecay: f.cfg.WeightDecay,
		Warmup: f.cfg.Warmup, Seed: f.cfg.Seed, Steps: f.steps, Clip: f.cfg.ClipNorm, Data: f.dataset, DataDir: f.data.dir,
		Limit: f.data.limit, CorpusBytes: l.corpusBytes, Vocab: l.vocab, Seq: l.seq, TokenWidth: l.tokenWidth,
		EvalTokens: l.evalTokens, Latency: launch.Duration(p.link.latency), Bandwidth: p.link.bandwidth}
	c.Model, c.Checkpoint, c.Resume = f.cfg.Model, f.cfg.Checkpoint, f.cfg.Resume
	return c
}

// pipelineDefaults is the config of `skyhive train pipeline` without
// flags, which a config file's fields replace.
func pipelineDefaults() launch.Pipeline {
	var p pipelineFlags
	p.register(pflag.NewFlagSet("train pipeline", pflag.ContinueOnError))
	return p.config()
}

// runPipelineFile runs a pipeline coordinator from a config file: the
// file's fields over the defaults of `skyhive train pipeline`, the fields
// it gives counting as given flags.
func runPipelineFile(ctx context.Context, stdout, stderr io.Writer, f launch.File) error {
	c := pipelineDefaults()
	if err := f.Decode(&c); err != nil { // refuses unknown fields and bad values
		return err
	}
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(f.Config, &fields); err != nil {
		return fmt.Errorf("launch: %s config: %w", f.Role, err)
	}
	if _, ok := fields["region"]; ok {
		return fmt.Errorf("%s config: %q is not an option of this role", f.Role, "region")
	}
	if err := selectProcess(c.Process); err != nil {
		return err
	}
	given := func(flag string) bool { _, ok := fields[strings.ReplaceAll(flag, "-", "_")]; return ok }
	return runPipelineRole(ctx, stdout, stderr, c, given)
}

// runPipelineRole runs a pipeline coordinator (pipeline.Train) with its
// typed config, from the flags or a config file; given tells which options
// the user gave. The result goes to stdout, the progress to stderr.
func runPipelineRole(ctx context.Context, stdout, stderr io.Writer, c launch.Pipeline, given func(string) bool) error {
	cfg, err := pipelineConfig(c, given)
	if err != nil {
		return err
	}
	stats, closeStats, err := (&outputFlags{stats: c.Stats}).openStats()
	if err != nil {
		return err
	}
	defer closeStats()
	reg, stopMetrics, err := (&metricsFlags{addr: c.Metrics}).start(ctx, stderr)
	if err != nil {
		return err
	}
	defer stopMetrics()
	cfg.Stats, cfg.Scenario.WorkerOutput = stats, os.Stderr
	cfg.Node.Metrics, cfg.Scenario.Coordinator.Metrics, cfg.Scenario.Coordinator.Host.Metrics = reg.Registerer(), reg.Registerer(), reg.Registerer()
	cfg.Announce = func(ctx context.Context, h *p2p.Host) { p2p.ReportReach(ctx, h, stderr, nil) }
	return pipeline.Train(ctx, cfg, stdout, stderr)
}

// pipelineConfig turns the coordinator's typed config into the pipeline's
// (pipeline.TrainConfigFrom), checking the options with their flag names
// in the errors.
func pipelineConfig(c launch.Pipeline, given func(string) bool) (pipeline.TrainConfig, error) {
	cfg, err := pipeline.TrainConfigFrom(c)
	if err != nil {
		return cfg, err
	}
	if !given("data") {
		cfg.Data = "" // the model's: fashion-mnist or gcide
	}
	if err := checkPipelineModel(&cfg, given); err != nil {
		return cfg, err
	}
	if cfg.Plan, err = readPlan(c.Plan); err != nil {
		return cfg, err
	}
	if err := checkCompare(cfg.Compare, c.CompareRounds); err != nil {
		return cfg, err
	}
	if cfg.Scenario, err = pipelineScenario(c); err != nil {
		return cfg, err
	}
	net, status := connectFlagsOf(c.Net), statusFlags{every: max(time.Duration(c.StatusEvery), 0)}
	if err := status.check(); err != nil {
		return cfg, err
	}
	seeds, err := net.seeds()
	if err != nil {
		return cfg, err
	}
	cfg.Node = pipeline.CoordinatorNode{DHT: node.BootstrapAddrs(seeds), StatusEvery: status.every}
	return cfg, nil
}

// checkPipelineModel refuses the options of the other kind of model than
// cfg.Model's and gives a language model the registry's defaults
// (models.DefaultsOf) of the training options not given.
func checkPipelineModel(cfg *pipeline.TrainConfig, given func(string) bool) error {
	if !train.IsLanguageModel(cfg.Model) {
		for _, name := range lmDataOnly {
			if given(name) {
				return fmt.Errorf("--%s is for language models; %s is an image classifier (language models: %s)", name, cfg.Model, models.LMUsage())
			}
		}
		if cfg.Limit < 0 {
			return fmt.Errorf("--limit must not be negative, got %d", cfg.Limit)
		}
		return nil
	}
	dataset := cfg.Data
	if dataset == "" {
		dataset = "gcide"
	}
	for _, name := range []string{"epochs", "limit", "data-dir", "compare"} {
		if given(name) && train.IsTextData(dataset) {
			return fmt.Errorf("--%s is for image models; a language model trains for --steps on --data %s", name, dataset)
		}
	}
	if strings.HasPrefix(dataset, "tokens:") && !given("vocab") {
		return fmt.Errorf("--data %s: give the vocabulary of the token file with --vocab (50257 for GPT-2's tokenizer)", dataset)
	}
	if strings.Contains(cfg.Model, ":") && !given("seq") {
		cfg.Text.Seq = 0 // the spec's
	}
	d := models.DefaultsOf(cfg.Model)
	if d.Batch > 0 && !given("batch") {
		cfg.Batch = d.Batch
	}
	if d.LR > 0 && !given("lr") {
		cfg.LR = d.LR
	}
	if d.Warmup > 0 && !given("warmup") {
		cfg.Warmup = d.Warmup
	}
	if d.ClipNorm > 0 && !given("clip") {
		cfg.Clip = d.ClipNorm
	}
	return nil
}

// readPlan reads the initial plan of --plan; nil without it.
func readPlan(path string) (*alloc.Plan, error) {
	if path == "" {
		return nil, nil
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("--plan: %w", err)
	}
	plan := &alloc.Plan{}
	if err := json.Unmarshal(b, plan); err != nil {
		return nil, fmt.Errorf("--plan %s: %w", path, err)
	}
	return plan, nil
}

// checkCompare checks the strategies of --compare, if any, and
// --compare-rounds.
func checkCompare(strategies []string, rounds int) error {
	if strategies == nil {
		return nil
	}
	if rounds < 1 {
		return fmt.Errorf("--compare-rounds %d: want at least 1", rounds)
	}
	for _, name := range strategies {
		if !slices.Contains(alloc.StrategyNames(), name) {
			return fmt.Errorf("--compare: unknown strategy %q (want some of %s)", name, strings.Join(alloc.StrategyNames(), ", "))
		}
	}
	return nil
}

// pipelineScenario is the coordinator's host and the local workers of
// --workers: their slowdowns, memory caps, binary and the emulated links
// of --regions or --latency between them.
func pipelineScenario(c launch.Pipeline) (pipeline.ScenarioConfig, error) {
	var cfg pipeline.ScenarioConfig
	net := connectFlagsOf(c.Net)
	var err error
	if cfg.Coordinator.Host, err = net.config(); err != nil {
		return cfg, err
	}
	prof, regions, err := pipelineLinks(c)
	if err != nil {
		return cfg, err
	}
	if c.Workers > 0 {
		if cfg.Slowdowns, err = localSlowdowns(c); err != nil {
			return cfg, err
		}
		caps, err := parseList(c.MemCaps, func(s string) (int64, error) { return strconv.ParseInt(s, 10, 64) })
		if err != nil || (caps != nil && len(caps) != c.Workers) {
			return cfg, fmt.Errorf("--mem-caps needs %d integers: %v", c.Workers, err)
		}
		cfg.MemCaps = caps
		if cfg.Binary, err = os.Executable(); err != nil {
			return cfg, fmt.Errorf("locating the skyhive binary: %w", err)
		}
	}
	if prof == nil {
		return cfg, nil
	}
	return cfg, cfg.Emulate(prof, regions, c.CoordinatorRegion, c.Seed)
}

// pipelineLinks is the region profile of --regions or --latency and
// --bandwidth (two regions a and b), and the regions of --worker-regions;
// nil without emulation.
func pipelineLinks(c launch.Pipeline) (*netem.Profile, []string, error) {
	link := linkFlags{latency: time.Duration(c.Latency), bandwidth: c.Bandwidth}
	regions, _ := parseList(c.WorkerRegions, func(s string) (string, error) { return s, nil })
	if regions != nil && len(regions) != c.Workers && (c.Regions != "" || link.set()) {
		return nil, nil, fmt.Errorf("--worker-regions has %d regions for %d workers", len(regions), c.Workers)
	}
	switch {
	case c.Regions != "" && link.set():
		return nil, nil, errors.New("use either --regions or --latency/--bandwidth")
	case c.Regions != "":
		prof, err := netem.LoadProfile(c.Regions)
		if err != nil {
			return nil, nil, fmt.Errorf("--regions: %w", err)
		}
		return prof, regions, nil
	case link.set():
		inter, err := link.params()
		if err != nil {
			return nil, nil, err
		}
		return &netem.Profile{Regions: []string{"a", "b"}, Intra: netem.LinkParams{Latency: 500 * time.Microsecond, Bandwidth: 1e9},
			Inter: [][]netem.LinkParams{{{}, inter}, {inter, {}}}}, regions, nil
	case c.WorkerRegions != "" || c.CoordinatorRegion != "":
		return nil, nil, errors.New("--worker-regions and --coordinator-region need --regions or --latency")
	}
	return nil, nil, nil
}

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

// localSlowdowns returns the slowdown of every local worker: --slowdowns,
// or draws from U[1, --slowdown-max] (pipeline.LocalSlowdowns).
func localSlowdowns(c launch.Pipeline) ([]float64, error) {
	sl, err := parseList(c.Slowdowns, func(s string) (float64, error) { return strconv.ParseFloat(s, 64) })
	if err != nil {
		return nil, fmt.Errorf("--slowdowns: %w", err)
	}
	if sl != nil {
		if len(sl) != c.Workers {
			return nil, fmt.Errorf("--slowdowns has %d values for %d workers", len(sl), c.Workers)
		}
		return sl, nil
	}
	if c.SlowdownMax < 1 {
		return nil, fmt.Errorf("--slowdown-max must be at least 1, got %v", c.SlowdownMax)
	}
	return pipeline.LocalSlowdowns(c.Workers, c.SlowdownMax, c.Seed), nil
}
