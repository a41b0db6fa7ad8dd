package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/skyhive/skyhive/alloc"
	"github.com/skyhive/skyhive/launch"
	"github.com/skyhive/skyhive/models"
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
			given := func(f string) bool { return cmd.Flags().Changed(strings.ReplaceAll(f, "_", "-")) }
			return runPipelineRole(cmd.Context(), cmd.OutOrStdout(), cmd.ErrOrStderr(), p.config(), given)
		},
	}
	cmd.PreRunE = checkedNumbers(numberRules{Positive: []string{"epochs", "batch", "lr"}, Negative: []string{"kill-worker"}})
	p.register(cmd.Flags())
	return cmd
}

// register adds the flags of `skyhive train pipeline`, with their defaults
// (pipeline.Defaults).
func (p *pipelineFlags) register(fl *pflag.FlagSet) {
	p.c = pipeline.Defaults()
	c := &p.c
	p.train.register(fl)
	p.train.registerModel(fl, "fashion-mnist or blobs; language models: "+train.TextDataUsage+", default gcide")
	fl.Lookup("model").Usage = "model: " + models.Usage() + "; or a language model: " + models.LMUsage() + " (a size without parameters, gpt-mini, takes --vocab and --seq)"
	p.train.lm.lmDataFlags.register(fl, 0)
	p.train.out.register(fl, "the result (plan, workers, events, last iteration)", "one per iteration, with per-stage times")
	fl.IntVar(&p.train.steps, "steps", 0, "stop after N iterations (0: --epochs)")
	fl.IntVar(&c.Workers, "workers", 0, "launch N local skyhive worker processes on loopback")
	fl.StringVar(&c.Slowdowns, "slowdowns", "", "comma-separated slowdown factor per local worker")
	fl.Float64Var(&c.SlowdownMax, "slowdown-max", c.SlowdownMax, "draw local workers' slowdowns from U[1,MAX] (seeded by --seed)")
	fl.StringVar(&c.MemCaps, "mem-caps", "", "comma-separated memory cap in bytes per local worker")
	fl.StringVar(&c.Executor, "executor", c.Executor, "what computes the local workers' layers: go, or python (their PyTorch twins; skyhive worker --executor)")
	fl.StringVar(&c.Python, "python", "", "with --executor python: the local workers' interpreter (default $SKYHIVE_PYTHON, else python3)")
	fl.StringVar(&c.Device, "device", c.Device, "with --executor python: the local workers' device, auto (a GPU when there is one), cpu, cuda or cuda:N")
	fl.IntVar(&c.JoinWait, "join-wait", 0, "wait for N external workers to join (skyhive worker --join ADDR)")
	p.net.register(fl, "DHT peers of a swarm to publish this coordinator's status record (stages, plan, loss) through, for skyhive status and skyhive dashboard (optional: the pipeline does not need a DHT)")
	p.status.registerEvery(fl)
	fl.StringVar(&c.Plan, "plan", "", "fixed initial plan JSON {\"stages\":[{\"device\":0,\"first\":0,\"last\":4},...]}")
	fl.StringVar(&c.Strategy, "strategy", c.Strategy, "allocation strategy ("+strings.Join(alloc.StrategyNames(), ", ")+")")
	fl.StringVar(&c.Schedule, "schedule", c.Schedule, "schedule (sequential, gpipe, 1f1b)")
	fl.IntVar(&c.Micro, "micro", c.Micro, "micro-batches per batch (gpipe, 1f1b)")
	fl.Float64Var(&c.ReplanThreshold, "replan-threshold", c.ReplanThreshold, "re-plan when a stage's speed drifts by this fraction (0: only on failures)")
	fl.IntVar(&c.CheckpointEvery, "checkpoint-every", c.CheckpointEvery, "snapshot all stages every N iterations")
	fl.DurationVar(durationVar(&c.IterTimeout), "iter-timeout", time.Duration(c.IterTimeout), "a stage that does not finish an iteration in time counts as failed")
	fl.IntVar(&c.LogEvery, "log-every", c.LogEvery, "print the per-stage breakdown every N iterations")
	fl.IntVar(&c.KillWorker, "kill-worker", c.KillWorker, "failure drill: SIGKILL local worker wK ...")
	fl.IntVar(&c.KillAt, "kill-at", 0, "... before iteration N")
	fl.StringVar(&c.Regions, "regions", "", "emulate the links between local workers with this netem region profile (e.g. examples/regions.json)")
	fl.StringVar(&c.WorkerRegions, "worker-regions", "", "comma-separated region per local worker (default: round-robin over the profile's regions)")
	fl.StringVar(&c.CoordinatorRegion, "coordinator-region", "", "the coordinator's region (default: the profile's first)")
	p.link.register(fl, "between two regions a and b of local workers (instead of --regions)", 0)
	fl.StringVar(&c.Compare, "compare", "", "before training, calibrate the cost model on 5 iterations of the first plan, then measure the iteration time of these strategies' plans in turn next to their calibrated predictions (e.g. even,skyhive), then train with --strategy")
	fl.IntVar(&c.CompareRounds, "compare-rounds", c.CompareRounds, "measured iterations per strategy of --compare (alternating, after one warm-up each)")
	p.train.metrics.register(fl)
	renameFlags(fl, map[string]string{"link-latency": "latency", "link-bandwidth": "bandwidth", "micro-batches": "micro"})
}

// config is the coordinator's typed config the flags give.
func (p *pipelineFlags) config() launch.Pipeline {
	c, f, l := p.c, &p.train, p.train.lm
	c.Net = p.net.Net
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
	given, err := pipeline.DecodeLaunch(f, &c)
	if err != nil {
		return err
	}
	if err := selectProcess(c.Process); err != nil {
		return err
	}
	return runPipelineRole(ctx, stdout, stderr, c, given)
}

// runPipelineRole runs a pipeline coordinator (pipeline.RunRole) with its
// typed config, from the flags or a config file; given tells which options
// the user gave, by JSON name. The result goes to stdout, the progress to
// stderr.
func runPipelineRole(ctx context.Context, stdout, stderr io.Writer, c launch.Pipeline, given func(string) bool) error {
	cfg, err := pipelineConfig(c, given)
	if err != nil {
		return err
	}
	cfg.Scenario.WorkerOutput = os.Stderr
	return flagError(pipeline.RunRole(ctx, cfg, c.Stats, c.Metrics, stdout, stderr))
}

// pipelineConfig is the pipeline's config of the coordinator's typed config
// (pipeline.FromLaunch, its errors naming flags), with the coordinator's
// host and the skyhive binary of the local workers.
func pipelineConfig(c launch.Pipeline, given func(string) bool) (pipeline.TrainConfig, error) {
	cfg, err := pipeline.FromLaunch(c, given)
	if err != nil {
		return cfg, flagError(err)
	}
	if cfg.Scenario.Coordinator.Host, err = roleHost(c.Net, c.Process); err != nil {
		return cfg, err
	}
	if c.Workers > 0 {
		if cfg.Scenario.Binary, err = os.Executable(); err != nil {
			return cfg, fmt.Errorf("locating the skyhive binary: %w", err)
		}
	}
	return cfg, nil
}
