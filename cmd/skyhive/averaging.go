package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/skyhive/skyhive/averaging"
	"github.com/skyhive/skyhive/averaging/optimizer"
	"github.com/skyhive/skyhive/averaging/peer"
	"github.com/skyhive/skyhive/averaging/sim"
	"github.com/skyhive/skyhive/data"
	"github.com/skyhive/skyhive/models"
	"github.com/skyhive/skyhive/p2p"
	"github.com/skyhive/skyhive/wire"
)

// peerFlags are the options of `skyhive peer`.
type peerFlags struct {
	cfg    peer.Config
	net    connectFlags
	algo   string
	match  string
	codec  string
	aggr   string
	shard  string
	stats  string
	asJSON bool
	quiet  bool
}

func newPeerCmd() *cobra.Command {
	var f peerFlags
	cmd := &cobra.Command{
		Use:   "peer",
		Short: "Run one group-averaging peer (WAGMA, all-reduce SGD or local SGD) that joins a swarm through the DHT",
		Long: "Run one data-parallel training peer in this process: it joins the swarm's DHT, waits for\n" +
			"--min-peers peers of --run-id, downloads the swarm's model and optimizer state if the run has\n" +
			"made progress (from two donors, cross-checked), and trains Fashion-MNIST at its real speed,\n" +
			"averaging with the others as --algo says. It listens on all interfaces by default. SIGINT or\n" +
			"SIGTERM makes it leave cleanly: its groups are told at once, it evaluates its model and saves\n" +
			"--checkpoint, which a restart resumes from. --json prints a final result line in the\n" +
			"benchmark protocol; --stats FILE appends JSON lines with counters, memory and goroutines.",
		Example: "  skyhive dht --listen /ip4/0.0.0.0/tcp/4001              # prints its /p2p address\n" +
			"  skyhive peer --dht /ip4/10.0.0.1/tcp/4001/p2p/12D3Koo... --algo wagma --duration 10m\n" +
			"  skyhive peer --dht ADDR --algo allreduce --min-peers 4   # rank-based: exactly 4 peers\n" +
			"  srun skyhive peer --dht ADDR --shard $SLURM_PROCID/$SLURM_NTASKS   # see examples/slurm",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error { return runPeer(cmd, &f) },
	}
	fl := cmd.Flags()
	c := &f.cfg
	f.net.register(fl, "DHT peers of the swarm to join: multiaddrs ending in /p2p/PEER_ID (required)")
	fl.StringVar(&c.RunID, "run-id", "skyhive", "run name in DHT keys; every peer of a run must use the same")
	fl.StringVar(&f.algo, "algo", "wagma", "averaging algorithm: wagma, allreduce or local")
	fl.StringVar(&f.match, "matchmaking", "", "how groups form: dht (Moshpit-style groups every round, peers may join and leave; default for wagma) or ranks (fixed roster of exactly --min-peers peers; default for allreduce and local)")
	fl.IntVar(&c.GroupSize, "group-size", 0, "group size (0: 3 with dht matchmaking, round(sqrt(peers)) with ranks)")
	fl.IntVar(&c.Tau, "tau", optimizer.DefaultTau, "WAGMA with ranks: a global average every tau rounds")
	fl.IntVar(&c.Period, "period", optimizer.DefaultPeriod, "local SGD: average models every period steps; allreduce: re-synchronize models every period steps")
	fl.DurationVar(&c.RoundInterval, "round-interval", averaging.DefaultRoundInterval, "wall-clock length of a DHT matchmaking round")
	fl.StringVar(&f.codec, "codec", "none", "compression of averaging traffic: none, fp16, uniform8 or quantile8")
	fl.StringVar(&f.aggr, "aggregation", "mean", "how a group combines contributions: mean, or for open swarms centered-clip or trimmed-mean (robust to a minority of bad contributions; slower)")
	fl.Float64Var(&c.MaxNormRatio, "max-norm-ratio", averaging.DefaultMaxNormRatio, "drop a contribution whose norm is over this multiple of the group's median (negative: keep every finite one)")
	fl.IntVar(&c.MinAgree, "min-agree", 1, "a joiner uses the swarm's state only if this many donors serve agreeing states (2 for open swarms)")
	fl.DurationVar(&c.Timeout, "timeout", 0, "longest wait for one all-reduce (0: the round interval with dht matchmaking, 20s with ranks)")
	fl.IntVar(&c.MinPeers, "min-peers", 2, "peers of the run (this one included) to wait for before training")
	fl.DurationVar(&c.WaitPeers, "wait-peers", time.Minute, "how long to wait for --min-peers")
	fl.DurationVar(&c.JoinTimeout, "join-timeout", 30*time.Second, "how long joining the DHT and downloading the swarm's state may take")
	fl.Int64Var(&c.TargetBatchSize, "target-batch-size", 0, "samples summed over the swarm that make one swarm epoch (0: epochs do not advance)")
	fl.StringVar(&c.Model, "model", "mlp-small", "model: "+models.Usage()+" (every peer of a run must agree)")
	fl.Uint64Var(&c.Seed, "seed", 1, "seed of the initial weights (equal on every peer) and of the batch order (mixed with the peer ID)")
	fl.IntVar(&c.Batch, "batch", 32, "examples per local step")
	fl.Float64Var(&c.LR, "lr", 0.05, "SGD learning rate (cosine decay to a tenth over --steps or --duration when given)")
	fl.Float64Var(&c.Momentum, "momentum", 0.9, "SGD momentum")
	fl.StringVar(&c.DataDir, "data-dir", data.DefaultDir, "directory holding the Fashion-MNIST IDX files")
	fl.IntVar(&c.Limit, "limit", 0, "use only the first N training examples (0 = all)")
	fl.StringVar(&f.shard, "shard", "", "train on shard K/N of the data (e.g. $SLURM_PROCID/$SLURM_NTASKS; default: all of it, in this peer's own order)")
	fl.IntVar(&c.EvalExamples, "eval-examples", 0, "test examples per evaluation (0 = all 10000)")
	fl.IntVar(&c.Steps, "steps", 0, "stop after this many local steps (0: no limit)")
	fl.DurationVar(&c.Duration, "duration", 0, "stop after this long (0: no limit; stop with Ctrl-C)")
	fl.DurationVar(&c.EvalEvery, "eval-every", 0, "evaluate on the test set this often (0: only at the end)")
	fl.Float64Var(&c.Slowdown, "slowdown", 1, "emulate a slower device: each step takes this many times its compute time (experiments)")
	fl.StringVar(&c.Checkpoint, "checkpoint", "", "checkpoint file: resumed from if it exists, written atomically every --checkpoint-every and on exit")
	fl.DurationVar(&c.CheckpointEvery, "checkpoint-every", time.Minute, "checkpoint interval")
	fl.StringVar(&f.stats, "stats", "", "append JSON lines with counters, accuracy, memory and goroutines to this file")
	fl.DurationVar(&c.StatsEvery, "stats-every", 10*time.Second, "interval of --stats lines")
	fl.BoolVar(&f.asJSON, "json", false, "print the final result as one JSON line (benchmark protocol) on stdout")
	fl.BoolVar(&f.quiet, "quiet", false, "no progress bar")
	return cmd
}

func runPeer(cmd *cobra.Command, f *peerFlags) error {
	c := f.cfg
	var err error
	if c.DHT, err = f.net.seeds(); err != nil {
		return err
	}
	c.DHTMaxBytes = f.net.dhtMaxBytes()
	if c.Host, err = f.net.config(); err != nil {
		return err
	}
	if len(c.DHT) == 0 {
		return fmt.Errorf("--dht is required: the multiaddr of a `skyhive dht` node or of a peer of the swarm, ending in /p2p/PEER_ID")
	}
	if c.Algo, err = optimizer.ParseAlgo(f.algo); err != nil {
		return fmt.Errorf("--algo: %w", err)
	}
	if f.match != "" {
		if c.Matchmaking, err = averaging.ParseMatchmaking(f.match); err != nil {
			return fmt.Errorf("--matchmaking: %w", err)
		}
	}
	if c.Codec, err = wire.ParseCodec(f.codec); err != nil {
		return fmt.Errorf("--codec: %w", err)
	}
	if c.Aggregation, err = averaging.ParseAggregation(f.aggr); err != nil {
		return fmt.Errorf("--aggregation: %w", err)
	}
	if f.shard != "" {
		k, n, ok := strings.Cut(f.shard, "/")
		var e1, e2 error
		c.Shard, e1 = strconv.Atoi(k)
		c.Shards, e2 = strconv.Atoi(n)
		if !ok || e1 != nil || e2 != nil || c.Shards < 1 || c.Shard < 0 || c.Shard >= c.Shards {
			return fmt.Errorf("--shard wants K/N with 0 <= K < N, got %q", f.shard)
		}
	}
	if !f.quiet {
		c.Progress = cmd.ErrOrStderr()
	}
	c.Log = cmd.ErrOrStderr()
	c.Reach = func(r p2p.Reach) { printReach(cmd.ErrOrStderr(), r) }
	if f.stats != "" {
		sf, err := os.OpenFile(f.stats, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
		if err != nil {
			return fmt.Errorf("--stats: %w", err)
		}
		defer sf.Close()
		c.Stats = sf
	}
	res, err := peer.Run(cmd.Context(), c)
	if c.Progress != nil {
		fmt.Fprintln(c.Progress)
	}
	if err != nil {
		return peerFlagHint(err)
	}
	return reportPeer(cmd.OutOrStdout(), res, f.asJSON)
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

// reportPeer prints a peer's result: one JSON line in the benchmark
// protocol, or a sentence.
func reportPeer(w io.Writer, r peer.Result, asJSON bool) error {
	if !asJSON {
		fmt.Fprintf(w, "peer %s: test accuracy %.2f%% after %d steps, %d rounds, %.0fs; %.1f MB sent\n",
			shortID(r.Peer), 100*r.TestAccuracy, r.Steps, r.Rounds, r.Seconds, float64(r.BytesSent)/1e6)
		return nil
	}
	line := map[string]any{
		"suite": "peer", "case": r.Algo, "metric": "test_accuracy", "value": r.TestAccuracy, "unit": "fraction",
		"peer": r.Peer, "test_accuracy": r.TestAccuracy, "test_loss": r.TestLoss, "first_accuracy": r.FirstAccuracy,
		"steps": r.Steps, "rounds": r.Rounds, "samples": r.Samples, "bytes_sent": r.BytesSent,
		"bytes_received": r.BytesReceived, "seconds": r.Seconds, "groups": r.Groups, "failures": r.Failures, "max_step_seconds": r.MaxStepSeconds,
		"joined_from": r.Joined, "resumed": r.Resumed, "epoch": r.Epoch, "swarm_peers": r.SwarmPeers,
	}
	return json.NewEncoder(w).Encode(line)
}

func shortID(s string) string {
	if len(s) > 12 {
		return s[len(s)-8:]
	}
	return s
}

// averagingFlags are the options of train averaging and demo averaging,
// which launch `skyhive peer` processes on this machine; the flags they pass
// on have the peer's names.
type averagingFlags struct {
	algo     string
	peers    int
	group    int
	tau      int
	period   int
	model    string
	seed     uint64
	batch    int
	lr       float64
	momentum float64
	slowLo   float64
	slowHi   float64
	duration time.Duration
	codec    string
	match    string
	interval time.Duration
	runID    string
	dir      string
	small    bool // retired --small
	data     dataFlags
	out      outputFlags
}

func (a *averagingFlags) register(fl *pflag.FlagSet) {
	fl.StringVar(&a.algo, "algo", "wagma", "averaging algorithm: wagma, allreduce or local")
	fl.IntVar(&a.peers, "peers", 4, "peer processes (skyhive peer) to start on this machine")
	fl.StringVar(&a.model, "model", "mlp-small", "model: "+models.Usage()+" (mlp-small keeps many peers light on few cores)")
	fl.Uint64Var(&a.seed, "seed", 1, "seed of the initial weights, the slowdowns and the batch order")
	fl.IntVar(&a.batch, "batch", 64, "examples per local step")
	fl.Float64Var(&a.lr, "lr", 0.05, "SGD learning rate of each peer (cosine decay to a tenth over --duration)")
	fl.Float64Var(&a.momentum, "momentum", 0.9, "SGD momentum")
	fl.DurationVar(&a.duration, "duration", time.Minute, "how long the peers train")
	fl.IntVar(&a.group, "group-size", 0, "averaging group size (0: the peer's default)")
	fl.IntVar(&a.tau, "tau", optimizer.DefaultTau, "WAGMA with ranks: a global average every tau rounds")
	fl.IntVar(&a.period, "period", optimizer.DefaultPeriod, "local SGD: average models every period steps; allreduce: re-synchronize models every period steps")
	fl.Float64Var(&a.slowLo, "slowdown-min", 1, "smallest emulated peer slowdown (slowdowns are drawn from U[MIN, MAX])")
	fl.Float64Var(&a.slowHi, "slowdown-max", 2, "largest emulated peer slowdown")
	fl.StringVar(&a.codec, "codec", "none", "compression of averaging traffic: none, fp16, uniform8 or quantile8")
	fl.StringVar(&a.match, "matchmaking", "", "dht (default for wagma) or ranks (default for allreduce and local)")
	fl.DurationVar(&a.interval, "round-interval", averaging.DefaultRoundInterval, "wall-clock length of a DHT matchmaking round")
	fl.StringVar(&a.runID, "run-id", "skyhive", "run name in DHT keys")
	fl.StringVar(&a.dir, "logs", "", "directory for the peers' logs and stats (default: a new temporary one)")
	a.data.register(fl)
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
			"slowdowns drawn from U[--slowdown-min, --slowdown-max], let them train Fashion-MNIST for\n" +
			"--duration while averaging as --algo says, and print every peer's test accuracy. Logs and\n" +
			"stats of each peer are kept in --logs. Across machines, run `skyhive peer` on each.",
		Example: "  skyhive train averaging --algo wagma --peers 4 --duration 1m\n" +
			"  skyhive train averaging --algo allreduce --peers 8 --logs runs/ar --json",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error { return a.run(cmd) },
	}
	a.register(cmd.Flags())
	return cmd
}

func (a *averagingFlags) run(cmd *cobra.Command) error {
	if _, err := optimizer.ParseAlgo(a.algo); err != nil {
		return fmt.Errorf("--algo: %w", err)
	}
	switch {
	case a.peers < 1 || a.peers > 64:
		return fmt.Errorf("--peers must be in 1..64, got %d", a.peers)
	case a.slowLo < 1 || a.slowHi < a.slowLo:
		return fmt.Errorf("--slowdown-min and --slowdown-max must satisfy 1 <= min <= max, got %v..%v", a.slowLo, a.slowHi)
	case a.duration <= 0:
		return fmt.Errorf("--duration must be positive")
	case a.data.limit < 0:
		return fmt.Errorf("--limit must not be negative, got %d", a.data.limit)
	}
	if a.small {
		a.model = "mlp-small"
	}
	exe, err := os.Executable()
	if err != nil {
		return err
	}
	dir := a.dir
	if dir == "" {
		if dir, err = os.MkdirTemp("", "skyhive-averaging-"); err != nil {
			return err
		}
	}
	args := []string{"--algo", a.algo, "--model", a.model, "--duration", a.duration.String(), "--quiet",
		"--lr", strconv.FormatFloat(a.lr, 'g', -1, 64), "--momentum", strconv.FormatFloat(a.momentum, 'g', -1, 64),
		"--batch", strconv.Itoa(a.batch), "--seed", strconv.FormatUint(a.seed, 10),
		"--data-dir", a.data.dir, "--limit", strconv.Itoa(a.data.limit),
		"--codec", a.codec, "--round-interval", a.interval.String(), "--run-id", a.runID,
		"--group-size", strconv.Itoa(a.group), "--tau", strconv.Itoa(a.tau), "--period", strconv.Itoa(a.period),
		"--eval-every", (a.duration / 4).String(), "--stats-every", "5s"}
	if a.match != "" {
		args = append(args, "--matchmaking", a.match)
	}
	out := cmd.ErrOrStderr()
	slow := sim.DrawSlowdowns(a.peers, a.slowLo, a.slowHi, a.seed)
	fmt.Fprintf(out, "%s with %d peer processes (slowdowns %.1f..%.1f), %s, %v; logs in %s\n",
		a.algo, a.peers, a.slowLo, a.slowHi, a.model, a.duration, dir)
	res, err := peer.Launch(cmd.Context(), peer.LaunchConfig{
		Exe: exe, Peers: a.peers, Slowdowns: slow, Args: args, Dir: dir, Duration: a.duration, Log: out,
	})
	if serr := a.copyStats(dir); serr != nil && err == nil {
		err = serr
	}
	if a.out.json {
		if jerr := printJSON(cmd.OutOrStdout(), res); jerr != nil {
			return jerr
		}
	} else {
		for i, r := range res.Peers {
			fmt.Fprintf(cmd.OutOrStdout(), "  peer %d (%s): test accuracy %.2f%%, %d steps, %d rounds, %.1f MB sent\n",
				i, shortID(r.Peer), 100*r.TestAccuracy, r.Steps, r.Rounds, float64(r.BytesSent)/1e6)
		}
		fmt.Fprintf(cmd.OutOrStdout(), "%s: mean test accuracy of %d peers %.2f%% (logs: %s)\n",
			a.algo, len(res.Peers), 100*res.MeanAccuracy, filepath.Clean(dir))
	}
	return err
}

// copyStats appends every peer's stats lines to --stats.
func (a *averagingFlags) copyStats(dir string) error {
	w, closeStats, err := a.out.openStats()
	if err != nil || w == nil {
		return err
	}
	defer closeStats()
	for i := range a.peers {
		b, err := os.ReadFile(peer.StatsFile(dir, i))
		if errors.Is(err, os.ErrNotExist) {
			continue // the peer never got to write one
		}
		if err != nil {
			return fmt.Errorf("--stats: %w", err)
		}
		if _, err := w.Write(b); err != nil {
			return fmt.Errorf("--stats: %w", err)
		}
	}
	return nil
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
