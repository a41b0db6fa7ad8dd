package main

import (
	"context"
	"io"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/skyhive/skyhive/launch"
	"github.com/skyhive/skyhive/metrics"
	"github.com/skyhive/skyhive/moe/server"
	"github.com/skyhive/skyhive/moe/trainer"
	"github.com/skyhive/skyhive/node"
	"github.com/skyhive/skyhive/p2p"
	"github.com/skyhive/skyhive/train"
)

// moeFlags are the options of train moe and demo moe: the trainers, the
// DMoE layers and how they call experts, most of them straight into the
// trainer's typed config.
type moeFlags struct {
	cfg   launch.MoETrainer
	train trainFlags
	link  linkFlags
	rtt   time.Duration // retired --rtt and --emulated-rtt
	lm    lmDataFlags   // a DMoE language model's data (--data gcide)
}

// register adds the flags of both MoE commands; latency is the default
// one-way latency of the trainers' calls.
func (m *moeFlags) register(fl *pflag.FlagSet, latency time.Duration) {
	m.train.register(fl)
	m.train.out.register(fl, "the result (accuracy, steps, failures)", "one per epoch")
	fl.IntVar(&m.train.steps, "steps", 0, "stop after N steps in total (0: --epochs)")
	c := &m.cfg
	fl.StringVar(&c.Grids, "grids", "ffn.4.4", "one DMoE layer per grid, PREFIX.SIZE1.SIZE2… (comma-separated)")
	fl.IntVar(&c.Hidden, "hidden", server.DefaultHidden, "experts' hidden size (train moe without --hidden: what the swarm's experts declare on the DHT)")
	fl.IntVar(&c.KBest, "k-best", 4, "experts per sample")
	fl.IntVar(&c.KMin, "k-min", 1, "answers per sample before --timeout-after-k-min starts")
	fl.DurationVar(durationVar(&c.ForwardTimeout), "forward-timeout", 10*time.Second, "bound on a layer's forward calls")
	fl.DurationVar(durationVar(&c.TimeoutAfterKMin), "timeout-after-k-min", time.Second, "extra wait once every sample has --k-min answers")
	fl.DurationVar(durationVar(&c.BackwardTimeout), "backward-timeout", 10*time.Second, "bound on a layer's backward calls")
	fl.IntVar(&c.Trainers, "trainers", 1, "concurrent trainers in this process sharing the local layers")
	fl.IntVar(&c.EvalLimit, "eval-limit", 0, "evaluate on the first N test examples (0: all)")
	fl.DurationVar(durationVar(&c.DHTCache), "dht-cache", 30*time.Second, "how long beam search caches prefix records")
	fl.BoolVar(&c.AllowZeroOutputs, "allow-zero-outputs", false, "samples no expert answered pass zeros instead of failing the step")
	fl.Float64Var(&c.MaxFailedSteps, "max-failed-steps", trainer.DefaultMaxFailed, "fraction of steps that may fail (no expert answered): a run with more failed steps exits with an error")
	m.link.register(fl, "of every expert and DHT call of the trainers, each way", latency)
	fl.DurationVar(&m.rtt, "rtt", 0, "retired: use --latency, the one-way latency (half the round trip)")
	_ = fl.MarkDeprecated("rtt", "use --latency with the one-way latency (half of --rtt)")
	fl.StringVar(&c.Data, "data", "fashion-mnist", "fashion-mnist (a DMoE classifier) or text for a DMoE transformer language model: "+train.TextDataUsage)
	m.lm.register(fl, 20000)
	fl.IntVar(&c.Heads, "heads", 2, "language model: attention heads (dividing --hidden)")
	fl.Float64Var(&c.Clip, "clip", 1, "language model: global norm clip of the local gradients (0 disables)")
	renameFlags(fl, map[string]string{"moe-grids": "grids", "moe-hidden": "hidden", "moe-steps": "steps", "moe-listen": "listen", "emulated-rtt": "rtt"})
}

// moeNumbers are the MoE commands' rules for numeric flags.
var moeNumbers = numberRules{Positive: []string{"epochs", "batch", "lr", "hidden", "k-best", "k-min", "trainers", "heads", "seq", "servers"}}

// config turns the flags both MoE commands share into a trainer's typed
// config; the network and process options are the caller's.
func (m *moeFlags) config() launch.MoETrainer {
	f, c := &m.train, m.cfg
	latency := m.link.latency
	if m.rtt != 0 {
		latency = m.rtt / 2 // the retired --rtt is the round trip
	}
	c.Output = launch.Output{JSON: f.out.json, Stats: f.out.stats}
	c.Epochs, c.Batch, c.LR, c.WeightDecay, c.Warmup, c.Seed = f.cfg.Epochs, f.cfg.BatchSize, f.cfg.LR, f.cfg.WeightDecay, f.cfg.Warmup, f.cfg.Seed
	c.Steps, c.DataDir, c.Limit, c.Latency, c.Bandwidth = f.steps, f.data.dir, f.data.limit, launch.Duration(latency), m.link.bandwidth
	c.CorpusBytes, c.Vocab, c.Seq, c.TokenWidth, c.EvalTokens = m.lm.corpusBytes, m.lm.vocab, m.lm.seq, m.lm.tokenWidth, m.lm.evalTokens
	return c
}

// moeTrainFlags are the options of `skyhive train moe`.
type moeTrainFlags struct {
	moeFlags
	net    connectFlags
	status statusFlags
}

func newTrainMoECmd() *cobra.Command {
	var m moeTrainFlags
	cmd := &cobra.Command{
		Use:   "moe",
		Short: "Train the local layers of a decentralized mixture of experts against a swarm of expert servers",
		Long: "Join the swarm's DHT, and train a DMoE classifier on Fashion-MNIST: --trainers concurrent\n" +
			"trainers share the local layers; each DMoE layer (--grids) beam-searches the DHT for the\n" +
			"--k-best experts of every sample, calls them over libp2p and carries on past slow or dead\n" +
			"ones (--k-min, --timeout-after-k-min). The experts are hosted and trained by `skyhive server`.\n" +
			"With --data gcide (or text:PATH, tokens:PATH) it trains a DMoE transformer language model\n" +
			"instead, one block per grid whose feed-forward sub-block is the grid's experts, and reports\n" +
			"its validation perplexity. The model takes the experts' hidden size from their DHT records\n" +
			"unless --hidden is given, which must then be the servers' --hidden.",
		Example: "  skyhive server --experts 'ffn.[0:16].[0:16]'     # prints its address\n" +
			"  skyhive train moe --dht ADDR --grids ffn.16.16 --trainers 4 [--latency 50ms]\n" +
			"  skyhive train moe --dht ADDR --data gcide --grids ffn.16.16 --hidden 64 --seq 64 --steps 300",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return runMoETrainerRole(cmd.Context(), cmd.OutOrStdout(), cmd.ErrOrStderr(), m.config(cmd.Flags()))
		},
	}
	cmd.PreRunE = checkedNumbers(moeNumbers)
	m.register(cmd.Flags())
	return cmd
}

// register adds the flags of `skyhive train moe`, with their defaults.
func (m *moeTrainFlags) register(fl *pflag.FlagSet) {
	m.moeFlags.register(fl, 0)
	m.net.register(fl, "DHT peers of the swarm to join: multiaddrs ending in /p2p/PEER_ID (required)")
	m.status.register(fl)
	m.train.metrics.register(fl)
}

// config turns the flags into the trainer's typed config. Without --hidden
// its Hidden is 0: the experts' hidden size, from the DHT.
func (m *moeTrainFlags) config(fl *pflag.FlagSet) launch.MoETrainer {
	c := m.moeFlags.config()
	c.Net = m.net.Net
	c.Process = m.status.process(m.train.metrics.addr)
	if !fl.Changed("hidden") {
		c.Hidden = 0
	}
	return c
}

// moeTrainerDefaults is the config of `skyhive train moe` without flags,
// which a config file's fields replace.
func moeTrainerDefaults() launch.MoETrainer {
	var m moeTrainFlags
	fl := pflag.NewFlagSet("train moe", pflag.ContinueOnError)
	m.register(fl)
	return m.config(fl)
}

// runMoETrainerRole runs a MoE trainer (trainer.RunRole) with its typed
// config, from the flags of `skyhive train moe` or from a config file: its
// result on stdout, its progress and notices on stderr.
func runMoETrainerRole(ctx context.Context, stdout, stderr io.Writer, c launch.MoETrainer) error {
	host, err := roleHost(c.Net, c.Process)
	if err != nil {
		return err
	}
	return flagError(trainer.RunRole(ctx, trainer.RoleConfig{Node: node.FromLaunch(host, c.Net, c.Process, metrics.RoleTrainer), Trainer: c, Stdout: stdout, Stderr: stderr,
		Announce: func(ctx context.Context, h *p2p.Host) { p2p.ReportReach(ctx, h, stderr, nil) }}))
}

// newDemoMoECmd is `skyhive demo moe`: a whole DMoE swarm on loopback.
func newDemoMoECmd() *cobra.Command {
	var (
		m       moeFlags
		servers int
	)
	cmd := &cobra.Command{
		Use:   "moe",
		Short: "Start a DHT, expert servers and trainers on loopback and train a DMoE on Fashion-MNIST",
		Long: "Run a decentralized mixture of experts on this machine: a DHT bootstrap node, --servers\n" +
			"expert servers hosting the grids' experts, and --trainers trainers, all libp2p hosts on\n" +
			"loopback with an emulated --latency on the trainers' calls. The trainers share their\n" +
			"local layers and train on Fashion-MNIST with a progress bar. With --data gcide one trainer\n" +
			"trains a DMoE transformer language model and reports its validation perplexity.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return flagError(trainer.RunDemo(cmd.Context(), m.config(), servers, cmd.OutOrStdout(), cmd.ErrOrStderr()))
		},
	}
	cmd.PreRunE = checkedNumbers(moeNumbers)
	fl := cmd.Flags()
	m.register(fl, 10*time.Millisecond)
	fl.IntVar(&servers, "servers", 4, "expert servers to start")
	// Demo defaults: two 8×8 grids of small experts, 8 trainers, 3 epochs.
	for name, v := range map[string]string{"grids": "l0.8.8,l1.8.8", "trainers": "8", "epochs": "3", "batch": "64"} {
		f := fl.Lookup(name)
		_ = f.Value.Set(v)
		f.DefValue = v
	}
	return cmd
}
