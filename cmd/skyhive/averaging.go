package main

import (
	"encoding/json"
	"fmt"
	"io"
	"sync"
	"time"

	"github.com/skyhive/skyhive/averaging"
	"github.com/skyhive/skyhive/data"
	"github.com/skyhive/skyhive/progress"
	"github.com/skyhive/skyhive/wire"
	"github.com/spf13/cobra"
)

// averagingFlags are the options of --mode averaging and demo averaging.
type averagingFlags struct {
	algo      string
	peers     int
	groupSize int
	tau       int
	period    int
	lr        float64
	slowLo    float64
	slowHi    float64
	baseStep  time.Duration
	bandwidth float64
	duration  time.Duration
	codec     string
	small     bool
	transport string
	match     string
	dhtAddrs  []string
	interval  time.Duration
	runID     string
}

func (a *averagingFlags) register(cmd *cobra.Command) {
	fl := cmd.Flags()
	fl.StringVar(&a.algo, "algo", "wagma", "averaging algorithm (--mode averaging): wagma, allreduce or local")
	fl.IntVar(&a.peers, "peers", 8, "local peers (libp2p hosts on loopback, or goroutines on an in-memory network with --transport memnet)")
	fl.IntVar(&a.groupSize, "group-size", 0, "WAGMA group size S (0 = round(sqrt(peers)))")
	fl.IntVar(&a.tau, "tau", averaging.DefaultTau, "WAGMA staleness bound: global average every tau rounds")
	fl.IntVar(&a.period, "period", averaging.DefaultPeriod, "local SGD averaging period in steps")
	fl.Float64Var(&a.lr, "avg-lr", 0.02, "SGD learning rate of each peer (momentum 0.9)")
	fl.Float64Var(&a.slowLo, "avg-slowdown-min", 1, "averaging: peer slowdowns are drawn from U[min, max]")
	fl.Float64Var(&a.slowHi, "avg-slowdown-max", 4, "averaging: peer slowdowns are drawn from U[min, max]")
	fl.DurationVar(&a.baseStep, "base-step", 100*time.Millisecond, "emulated step time of a peer at slowdown 1")
	fl.Float64Var(&a.bandwidth, "bandwidth", 1e9, "emulated interface bandwidth of each peer in bit/s (0 = unlimited; memnet only)")
	fl.DurationVar(&a.duration, "duration", 2*time.Minute, "wall-clock length of the run")
	fl.StringVar(&a.codec, "codec", "none", "compression on the wire: none, fp16, uniform8 or quantile8")
	fl.StringVar(&a.transport, "transport", averaging.TransportLibp2p, "peer transport: libp2p (hosts on 127.0.0.1 TCP with TLS) or memnet (in-memory, emulated interfaces)")
	fl.StringVar(&a.match, "matchmaking", "", "how WAGMA finds groups: ranks (butterfly groups) or dht (Moshpit-style groups through a DHT; default with --dht)")
	fl.DurationVar(&a.interval, "round-interval", 2*time.Second, "wall-clock length of a DHT matchmaking round")
	fl.StringVar(&a.runID, "run-id", "skyhive", "run name in DHT keys; peers of one run must agree")
	fl.BoolVar(&a.small, "small", true, "train mlp-small (784-128-10) instead of --model, to keep many peers light on few cores")
}

// runAveraging trains with a local swarm of averaging peers.
func (f *trainFlags) runAveraging(cmd *cobra.Command) error {
	return f.avg.run(cmd, f)
}

func (a *averagingFlags) run(cmd *cobra.Command, f *trainFlags) error {
	algo, err := averaging.ParseAlgo(a.algo)
	if err != nil {
		return err
	}
	codec, err := wire.ParseCodec(a.codec)
	if err != nil {
		return err
	}
	// train shares --dht with --mode moe (it is registered there);
	// demo averaging registers its own.
	addrs := a.dhtAddrs
	if len(addrs) == 0 {
		addrs = f.moe.dht
	}
	seeds, err := parseBootstrap(addrs)
	if err != nil {
		return err
	}
	match := a.match
	if match == "" && len(seeds) > 0 {
		match = string(averaging.MatchDHT)
	}
	mm, err := averaging.ParseMatchmaking(match)
	if err != nil {
		return err
	}
	switch {
	case len(seeds) > 0 && a.transport != averaging.TransportLibp2p:
		return fmt.Errorf("--dht needs --transport libp2p")
	case len(seeds) > 0 && mm != averaging.MatchDHT:
		return fmt.Errorf("--dht needs --matchmaking dht")
	case mm == averaging.MatchDHT && algo != averaging.WAGMA:
		return fmt.Errorf("--matchmaking dht needs --algo wagma")
	case a.interval <= 0:
		return fmt.Errorf("--round-interval must be positive")
	case a.peers < 1 || a.peers > 256:
		return fmt.Errorf("--peers must be in 1..256, got %d", a.peers)
	case a.slowLo < 1 || a.slowHi < a.slowLo:
		return fmt.Errorf("slowdowns must satisfy 1 <= min <= max, got %v..%v", a.slowLo, a.slowHi)
	case a.duration <= 0 || a.baseStep <= 0:
		return fmt.Errorf("--duration and --base-step must be positive")
	case f.cfg.BatchSize <= 0:
		return fmt.Errorf("--batch must be positive")
	}
	model := f.cfg.Model
	if a.small {
		model = "mlp-small"
	}
	trainSet, err := data.LoadFashionMNIST(f.dataDir, data.Train, data.LoadOptions{Standardize: true, Limit: f.limit})
	if err != nil {
		return err
	}
	testSet, err := data.LoadFashionMNIST(f.dataDir, data.Test, data.LoadOptions{Standardize: true})
	if err != nil {
		return err
	}
	out := cmd.ErrOrStderr()
	slow := averaging.DrawSlowdowns(a.peers, a.slowLo, a.slowHi, f.cfg.Seed)
	fmt.Fprintf(out, "%s with %d peers over %s, %s matchmaking (slowdowns %.1f..%.1f), %s, %d train examples, %v\n",
		algo, a.peers, a.transport, mm, a.slowLo, a.slowHi, model, trainSet.Len(), a.duration)
	total := int(a.duration / time.Second)
	bar := progress.New(out, string(algo), total)
	bar.Every = max(total/20, 1)
	var mu sync.Mutex
	var steps, shown int
	var loss float64
	start := time.Now()
	cfg := averaging.SimConfig{
		Algo: algo, Peers: a.peers, GroupSize: a.groupSize, Tau: a.tau, Period: a.period,
		Model: model, Train: trainSet, Test: testSet, Batch: f.cfg.BatchSize, LR: a.lr, Momentum: 0.9,
		Slowdowns: slow, BaseStep: a.baseStep, Bandwidth: a.bandwidth, Latency: time.Millisecond,
		Codec: codec, Duration: a.duration, EvalEvery: a.duration / 8, Seed: f.cfg.Seed,
		Transport: a.transport, Matchmaking: mm, DHTSeeds: seeds, RoundInterval: a.interval, RunID: a.runID,
		OnStep: func(s averaging.StepInfo) {
			mu.Lock()
			defer mu.Unlock()
			steps++
			loss = 0.98*loss + 0.02*s.Loss
			if sec := int(time.Since(start) / time.Second); sec > shown && sec <= total {
				shown = sec
				bar.Update(sec, int64(steps*f.cfg.BatchSize), progress.F("loss", loss))
			}
		},
	}
	res, err := averaging.Simulate(cmd.Context(), cfg)
	fmt.Fprintln(out)
	if err != nil {
		return err
	}
	return reportAveraging(cmd.OutOrStdout(), res, f.asJSON)
}

func reportAveraging(w io.Writer, res averaging.SimResult, asJSON bool) error {
	if asJSON {
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		return enc.Encode(res)
	}
	for _, p := range res.Curve {
		fmt.Fprintf(w, "  %6.1fs  %6d steps  test accuracy %.2f%%\n", p.Seconds, p.Steps, 100*p.Accuracy)
	}
	fmt.Fprintf(w, "%s: test accuracy of the mean model %.2f%% after %.0fs, %.2f steps/s per peer\n",
		res.Algo, 100*res.FinalAccuracy, res.Seconds, res.StepsPerSecond)
	return nil
}

func newDemoAveragingCmd() *cobra.Command {
	var f trainFlags
	cmd := &cobra.Command{
		Use:   "averaging",
		Short: "Train Fashion-MNIST with WAGMA on a local swarm of 8 peers of unequal speed",
		Long: "Start 8 libp2p peers on loopback (or, with --transport memnet, on an in-memory network whose\n" +
			"interfaces are emulated at 1 Gbit/s), give them slowdowns drawn from U[1,4], and train Fashion-MNIST\n" +
			"with wait-avoiding group model averaging for two minutes, printing the test accuracy of the peers'\n" +
			"mean model along the way. --matchmaking dht forms the groups through a DHT instead of fixed ranks.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error { return f.avg.run(cmd, &f) },
	}
	f.register(cmd)
	f.avg.register(cmd)
	cmd.Flags().StringSliceVar(&f.avg.dhtAddrs, "dht", nil,
		"join an external DHT at these multiaddrs (ending in /p2p/PEER_ID) and match groups through it")
	return cmd
}
