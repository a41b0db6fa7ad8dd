package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/skyhive/skyhive/averaging/optimizer"
	"github.com/skyhive/skyhive/averaging/peer"
	"github.com/skyhive/skyhive/launch"
	"github.com/skyhive/skyhive/models"
	"github.com/skyhive/skyhive/p2p"
	"github.com/skyhive/skyhive/train"
)

// peerFlags are the options of `skyhive peer`: most are the fields of its
// typed config (launch.Peer), and config turns the rest into it.
type peerFlags struct {
	cfg     launch.Peer
	net     connectFlags
	lm      lmDataFlags
	status  statusFlags
	metrics metricsFlags
}

// registerAveragingLM adds the language-model options of `skyhive peer`
// and `skyhive train averaging` to c and lm, with the names, meanings and
// defaults of `skyhive train`'s.
func registerAveragingLM(fl *pflag.FlagSet, c *launch.Peer, lm *lmDataFlags) {
	fl.StringVar(&c.Data, "data", "fashion-mnist", "data: fashion-mnist for image models; for language models "+train.TextDataUsage+" (gcide by default; every peer of a run must read the same)")
	lm.register(fl, 0)
	fl.IntVar(&c.Warmup, "warmup", int(lmDefaults.Warmup), "language models: linear learning-rate warm-up steps")
	fl.Float64Var(&c.Clip, "clip", lmDefaults.ClipNorm, "language models: global norm clip of the (averaged) gradients (0 disables)")
	fl.Float64Var(&c.WeightDecay, "weight-decay", peer.DefaultWeightDecay, "language models: AdamW decoupled weight decay")
}

// setPeer sets c's language-model data options from the flags.
func (l lmDataFlags) setPeer(c *launch.Peer) {
	c.Vocab, c.Seq, c.TokenWidth, c.EvalTokens, c.CorpusBytes = l.vocab, l.seq, l.tokenWidth, l.evalTokens, l.corpusBytes
}

func newPeerCmd() *cobra.Command {
	var f peerFlags
	cmd := &cobra.Command{
		Use:   "peer",
		Short: "Run one group-averaging peer (WAGMA, all-reduce SGD or local SGD) that joins a swarm through the DHT",
		Long: "Run one data-parallel training peer in this process: it joins the swarm's DHT, waits for\n" +
			"--min-peers peers of --run-id, downloads the swarm's model and optimizer state if the run has\n" +
			"made progress (from two donors, cross-checked), and trains at its real speed, averaging with\n" +
			"the others as --algo says. It listens on all interfaces by default. SIGINT or SIGTERM makes it\n" +
			"leave cleanly: its groups are told at once, it evaluates its model and saves --checkpoint,\n" +
			"which a restart resumes from (only into the same model). --json prints a final result line in\n" +
			"the benchmark protocol; --stats FILE appends JSON lines with counters, memory and goroutines.\n\n" +
			"An image classifier (--model mlp-small, the default, and the others --model lists) trains\n" +
			"on Fashion-MNIST with SGD and momentum. A language model (--model gpt-mini, gpt-small,\n" +
			"gpt-medium or gpt:LAYERSxHIDDEN:VOCAB) trains on --data (gcide, gcide:PATH, text:PATH or\n" +
			"tokens:PATH) with AdamW on next-token cross entropy, with skyhive train's flags and defaults\n" +
			"(--vocab, --seq, --corpus-bytes, --token-width, --eval-tokens, --warmup, --clip,\n" +
			"--weight-decay; --lr 3e-3 and --batch 16 sequences unless given): every peer trains the same\n" +
			"BPE tokenizer on the same data and splits off the same tenth for validation (from --seed),\n" +
			"then samples its own windows; it reports the validation loss and perplexity next to the\n" +
			"unigram's. Peers with another model, context or tokenizer are not averaged with.",
		Example: "  skyhive dht --listen /ip4/0.0.0.0/tcp/4001              # prints its /p2p address\n" +
			"  skyhive peer --dht /ip4/10.0.0.1/tcp/4001/p2p/12D3Koo... --algo wagma --duration 10m\n" +
			"  skyhive peer --dht ADDR --algo allreduce --min-peers 4   # rank-based: a fixed roster of at least 4\n" +
			"  skyhive peer --dht ADDR --model gpt-mini --data gcide --duration 30m   # a GPT on the dictionary\n" +
			"  srun skyhive peer --dht ADDR --shard $SLURM_PROCID/$SLURM_NTASKS   # see examples/slurm",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg, err := f.config(cmd.Flags())
			if err != nil {
				return err
			}
			return runPeerRole(cmd.Context(), cmd.OutOrStdout(), cmd.ErrOrStderr(), cfg)
		},
	}
	f.register(cmd.Flags())
	return cmd
}

// register adds the flags of `skyhive peer`, with their defaults.
func (f *peerFlags) register(fl *pflag.FlagSet) {
	d := peer.Defaults()
	c := &f.cfg
	f.net.register(fl, "DHT peers of the swarm to join: multiaddrs ending in /p2p/PEER_ID (required)")
	fl.StringVar(&c.RunID, "run-id", d.RunID, "run name in DHT keys; every peer of a run must use the same")
	fl.StringVar(&c.Matchmaking, "matchmaking", "", "how groups form: dht (Moshpit-style groups every round, peers may join and leave; default for wagma) or ranks (a fixed roster: the peers of the run that answer and agree on it before training, at least --min-peers; default for allreduce and local)")
	fl.IntVar(&c.GroupSize, "group-size", 0, "group size (0: 3 with dht matchmaking, round(sqrt(peers)) with ranks)")
	registerAveragingFlags(fl, c)
	fl.StringVar(&c.Aggregation, "aggregation", d.Aggregation, "how a group combines contributions: mean, or for open swarms centered-clip or trimmed-mean (robust to a minority of bad contributions; slower)")
	fl.Float64Var(&c.MaxNormRatio, "max-norm-ratio", d.MaxNormRatio, "drop a contribution whose norm is over this multiple of the group's median (negative: keep every finite one)")
	fl.IntVar(&c.MinAgree, "min-agree", d.MinAgree, "a joiner uses the swarm's state only if this many donors serve agreeing states (2 for open swarms)")
	fl.DurationVar(durationVar(&c.Timeout), "timeout", 0, "longest wait for one all-reduce (0: the round interval with dht matchmaking, 20s with ranks)")
	fl.IntVar(&c.MinPeers, "min-peers", d.MinPeers, "peers of the run (this one included) to wait for before training")
	fl.DurationVar(durationVar(&c.WaitPeers), "wait-peers", time.Duration(d.WaitPeers), "how long to wait for --min-peers")
	fl.DurationVar(durationVar(&c.JoinTimeout), "join-timeout", time.Duration(d.JoinTimeout), "how long joining the DHT and downloading the swarm's state may take")
	fl.Int64Var(&c.TargetBatchSize, "target-batch-size", 0, "samples summed over the swarm that make one swarm epoch (0: epochs do not advance)")
	fl.StringVar(&c.Model, "model", d.Model, "model: "+models.Usage()+", or a language model: "+models.LMUsage()+", e.g. gpt-mini (every peer of a run must agree)")
	fl.Uint64Var(&c.Seed, "seed", d.Seed, "seed of the initial weights (equal on every peer) and of the batch order (mixed with the peer ID)")
	fl.IntVar(&c.Batch, "batch", 32, "examples per local step (language models: sequences, 16 unless given)")
	fl.Float64Var(&c.LR, "lr", 0.05, "SGD learning rate (cosine decay to a tenth over --steps or --duration when given); language models: AdamW's, 3e-3 unless given")
	fl.StringVar(&c.Shard, "shard", "", "train on shard K/N of the data (e.g. $SLURM_PROCID/$SLURM_NTASKS; default: all of it, in this peer's own order)")
	fl.IntVar(&c.EvalExamples, "eval-examples", 0, "test examples per evaluation (0 = all 10000)")
	fl.IntVar(&c.Steps, "steps", 0, "stop after this many local steps (0: no limit)")
	fl.DurationVar(durationVar(&c.Duration), "duration", 0, "stop after this long (0: no limit; stop with Ctrl-C)")
	fl.DurationVar(durationVar(&c.EvalEvery), "eval-every", 0, "evaluate on the test set this often (0: only at the end); diloco and wa-diloco evaluate their outer model")
	fl.Float64Var(&c.Slowdown, "slowdown", d.Slowdown, "emulate a slower device: each step takes this many times its compute time (experiments)")
	fl.StringVar(&c.Checkpoint, "checkpoint", "", "checkpoint file: resumed from if it exists, written atomically every --checkpoint-every and on exit")
	fl.DurationVar(durationVar(&c.CheckpointEvery), "checkpoint-every", time.Duration(d.CheckpointEvery), "checkpoint interval")
	fl.StringVar(&c.Stats, "stats", "", "append JSON lines with counters, accuracy, memory and goroutines to this file")
	fl.DurationVar(durationVar(&c.StatsEvery), "stats-every", time.Duration(d.StatsEvery), "interval of --stats lines")
	fl.BoolVar(&c.JSON, "json", false, "print the final result as one JSON line (benchmark protocol) on stdout")
	fl.BoolVar(&c.Quiet, "quiet", false, "no progress bar")
	registerAveragingLM(fl, c, &f.lm)
	f.status.register(fl)
	f.metrics.register(fl)
}

// config turns the flags into the peer's typed config, checking the
// language-model flags given against the model. Batch and LR not given
// are left 0: the model's defaults.
func (f *peerFlags) config(fl *pflag.FlagSet) (launch.Peer, error) {
	c := f.cfg
	c.Net = f.net.Net
	c.Process = f.status.process(f.metrics.addr)
	f.lm.setPeer(&c)
	if err := peer.Resolve(&c, flagsGiven(fl)); err != nil {
		return c, flagError(err)
	}
	if !fl.Changed("lr") {
		c.LR = 0
	}
	if !fl.Changed("batch") {
		c.Batch = 0
	}
	return c, nil
}

// runPeerRole runs an averaging peer (peer.RunRole) with its typed config,
// from the flags of `skyhive peer` or from a config file: its result on
// stdout, its progress and notices on stderr.
func runPeerRole(ctx context.Context, stdout, stderr io.Writer, l launch.Peer) error {
	host, err := roleHost(l.Net, l.Process)
	if err != nil {
		return err
	}
	err = peer.RunRole(ctx, peer.RoleConfig{Peer: l, Host: host, Stdout: stdout, Stderr: stderr,
		Reach: func(r p2p.Reach) { p2p.WriteReach(stderr, r) }})
	return peerFlagHint(flagError(err))
}

// peerFlagHint names the flags behind the peer's configuration errors.
func peerFlagHint(err error) error {
	switch {
	case errors.Is(err, peer.ErrNoSwarm):
		return fmt.Errorf("%w (flags --run-id, --min-peers, --wait-peers)", err)
	case errors.Is(err, optimizer.ErrModelMismatch):
		return fmt.Errorf("%w (flags --model, --run-id)", err)
	case errors.Is(err, peer.ErrDHT):
		return fmt.Errorf("%w (flags --dht, --join-timeout)", err)
	}
	return err
}

// averagingFlags are the options of train averaging and demo averaging,
// which launch `skyhive peer` processes on this machine: every peer's
// config, with the peer's flag names, and the local run's.
type averagingFlags struct {
	cfg     launch.Peer
	local   peer.LocalRun
	small   bool // retired --small
	lm      lmDataFlags
	out     outputFlags
	metrics metricsFlags
}

func (a *averagingFlags) register(fl *pflag.FlagSet) {
	c, r, d := &a.cfg, &a.local, peer.Defaults()
	fl.IntVar(&r.Peers, "peers", 4, "peer processes (skyhive peer) to start on this machine")
	fl.StringVar(&c.Model, "model", d.Model, "model: "+models.Usage()+" (mlp-small keeps many peers light on few cores), or a language model: "+models.LMUsage()+", e.g. gpt-mini")
	fl.Uint64Var(&c.Seed, "seed", d.Seed, "seed of the initial weights, the slowdowns and the batch order")
	fl.IntVar(&c.Batch, "batch", 64, "examples per local step (language models: sequences, 16 unless given)")
	fl.Float64Var(&c.LR, "lr", 0.05, "SGD learning rate of each peer (cosine decay to a tenth over --duration or --steps); language models: AdamW's, 3e-3 unless given")
	fl.DurationVar(durationVar(&c.Duration), "duration", time.Minute, "how long the peers train (with --steps alone: until they are done)")
	fl.IntVar(&c.Steps, "steps", 0, "stop each peer after this many local steps (0: --duration only)")
	fl.IntVar(&c.GroupSize, "group-size", 0, "averaging group size (0: the peer's default)")
	fl.Float64Var(&r.SlowdownMin, "slowdown-min", 1, "smallest emulated peer slowdown (slowdowns are drawn from U[MIN, MAX])")
	fl.Float64Var(&r.SlowdownMax, "slowdown-max", 2, "largest emulated peer slowdown")
	fl.StringVar(&c.Matchmaking, "matchmaking", "", "dht (default for wagma) or ranks (default for allreduce and local)")
	registerAveragingFlags(fl, c)
	fl.StringVar(&c.RunID, "run-id", d.RunID, "run name in DHT keys")
	fl.StringVar(&r.Dir, "logs", "", "directory for the peers' logs and stats (default: a new temporary one)")
	registerAveragingLM(fl, c, &a.lm)
	a.out.register(fl, "the peers' results", "every peer's stats lines, copied from --logs when the peers are done")
	fl.BoolVar(&a.small, "small", false, "retired: use --model mlp-small")
	_ = fl.MarkDeprecated("small", "use --model mlp-small (the default)")
	renameFlags(fl, map[string]string{"avg-lr": "lr", "avg-slowdown-min": "slowdown-min", "avg-slowdown-max": "slowdown-max"})
}

func newTrainAveragingCmd() *cobra.Command {
	var a averagingFlags
	cmd := &cobra.Command{
		Use:   "averaging",
		Short: "Train with group averaging (WAGMA, all-reduce SGD or local SGD) on a local swarm of `skyhive peer` processes",
		Long: "Start a DHT node and --peers `skyhive peer` processes on this machine with emulated\n" +
			"slowdowns drawn from U[--slowdown-min, --slowdown-max], let them train for --duration (or\n" +
			"--steps) while averaging as --algo says, and print every peer's result. Logs and stats of each\n" +
			"peer are kept in --logs. Across machines, run `skyhive peer` on each.\n\n" +
			"An image classifier (the default, mlp-small) trains on Fashion-MNIST and reports test\n" +
			"accuracy. A language model (--model gpt-mini, gpt-small, gpt-medium or\n" +
			"gpt:LAYERSxHIDDEN:VOCAB) trains on --data (gcide, gcide:PATH, text:PATH or tokens:PATH;\n" +
			"gcide by default) with AdamW, with the flags and defaults of `skyhive train` (--vocab, --seq,\n" +
			"--corpus-bytes, --token-width, --eval-tokens, --warmup, --clip, --weight-decay): each peer\n" +
			"is a replica that derives the same tokenizer and validation split from the data and --seed\n" +
			"and samples its own batches, and reports its validation loss and perplexity (--json:\n" +
			"val_loss, val_perplexity, unigram_perplexity per peer, and mean_val_perplexity).",
		Example: "  skyhive train averaging --algo wagma --peers 4 --duration 1m\n" +
			"  skyhive train averaging --algo allreduce --peers 8 --logs runs/ar --json\n" +
			"  skyhive train averaging --model gpt-mini --data gcide --algo allreduce --peers 2 --steps 500 --json",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error { return a.run(cmd) },
	}
	a.register(cmd.Flags())
	a.metrics.register(cmd.Flags())
	return cmd
}

// run launches the peers (peer.RunLocal), with their progress on stderr,
// and prints their results on stdout.
func (a *averagingFlags) run(cmd *cobra.Command) error {
	r := a.local
	r.Peer = a.cfg
	if a.small {
		r.Peer.Model = "mlp-small"
	}
	a.lm.setPeer(&r.Peer)
	if err := r.Resolve(flagsGiven(cmd.Flags())); err != nil {
		return flagError(err)
	}
	var err error
	if r.Exe, err = os.Executable(); err != nil {
		return err
	}
	r.Log, r.Out, r.JSON, r.Stats, r.Metrics = cmd.ErrOrStderr(), cmd.OutOrStdout(), a.out.json, a.out.stats, a.metrics.addr
	_, err = peer.RunLocal(cmd.Context(), r)
	return flagError(err)
}

func newDemoAveragingCmd() *cobra.Command {
	var a averagingFlags
	cmd := &cobra.Command{
		Use:   "averaging",
		Short: "Train Fashion-MNIST with WAGMA on a local swarm of `skyhive peer` processes of unequal speed",
		Long: "Start a DHT node and 4 `skyhive peer` processes on loopback, give them slowdowns drawn from\n" +
			"U[1,2], and train Fashion-MNIST for a minute with wait-avoiding group averaging, groups formed\n" +
			"through the DHT; then print every peer's test accuracy. It is `skyhive train averaging` with\n" +
			"its defaults; the same peers run across machines with `skyhive peer --dht ADDR`.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error { return a.run(cmd) },
	}
	a.register(cmd.Flags())
	return cmd
}

// registerAveragingFlags registers the averaging flags that skyhive peer
// and the commands that launch peers share: the algorithm, its periods, the
// compression, the SGD momentum and data of image models and DiLoCo's
// outer optimization.
func registerAveragingFlags(fl *pflag.FlagSet, c *launch.Peer) {
	d := peer.Defaults()
	fl.StringVar(&c.Algo, "algo", d.Algo, "averaging algorithm: wagma, allreduce, local, diloco (--inner-steps alone, then an outer Nesterov step on the averaged pseudo-gradients) or wa-diloco (every --inner-steps a background average in WAGMA's groups, every --tau outer steps a background DiLoCo outer step with all peers)")
	fl.IntVar(&c.Tau, "tau", d.Tau, "WAGMA with ranks: a global average every tau rounds (wa-diloco: a global outer step every tau outer steps)")
	fl.IntVar(&c.Period, "period", d.Period, "local SGD: average models every period steps; allreduce: re-synchronize models every period steps")
	fl.DurationVar(durationVar(&c.RoundInterval), "round-interval", time.Duration(d.RoundInterval), "wall-clock length of a DHT matchmaking round")
	fl.StringVar(&c.Codec, "codec", d.Codec, "compression of averaging traffic: none, fp16, uniform8 or quantile8")
	fl.Float64Var(&c.Momentum, "momentum", d.Momentum, "SGD momentum (image models)")
	fl.StringVar(&c.DataDir, "data-dir", d.DataDir, "directory holding the Fashion-MNIST IDX files")
	fl.IntVar(&c.Limit, "limit", 0, "use only the first N training examples (0 = all)")
	fl.IntVar(&c.InnerSteps, "inner-steps", d.InnerSteps, "diloco and wa-diloco: local steps between outer steps (H)")
	fl.IntVar(&c.WarmupInnerSteps, "warmup-inner-steps", 0, "diloco and wa-diloco: H of the first outer step, doubled at every outer step up to --inner-steps (0: no warm-up)")
	fl.Float64Var(&c.OuterLR, "outer-lr", d.OuterLR, "diloco and wa-diloco: outer learning rate")
	fl.Float64Var(&c.OuterMomentum, "outer-momentum", d.OuterMomentum, fmt.Sprintf("diloco and wa-diloco: outer Nesterov momentum in [0, 1) (0 or %d: none)", optimizer.NoMomentum))
	fl.IntVar(&c.Fragments, "fragments", 0, "diloco: Streaming DiLoCo, the parameters in this many fragments that take their outer steps in turn, one every --inner-steps/N steps (0 or 1: the whole model at once)")
	fl.IntVar(&c.OverlapSteps, "overlap-steps", 0, "diloco: inner steps an outer step's all-reduce runs behind before it is applied (0: wait for it)")
}
