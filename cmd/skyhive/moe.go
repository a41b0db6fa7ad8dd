package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/spf13/cobra"

	"github.com/skyhive/skyhive/data"
	"github.com/skyhive/skyhive/dht"
	"github.com/skyhive/skyhive/moe"
	"github.com/skyhive/skyhive/moe/client"
	"github.com/skyhive/skyhive/moe/server"
	"github.com/skyhive/skyhive/netem"
	"github.com/skyhive/skyhive/optim"
	"github.com/skyhive/skyhive/p2p"
	"github.com/skyhive/skyhive/progress"
	"github.com/skyhive/skyhive/wire"
)

// moeFlags are the options of `skyhive train --mode moe`.
type moeFlags struct {
	dht              []string
	listen           []string
	grids            string
	hidden           int
	kBest, kMin      int
	forwardTimeout   time.Duration
	afterKMin        time.Duration
	backwardTimeout  time.Duration
	trainers         int
	delay            time.Duration
	steps            int
	evalLimit        int
	cacheTTL         time.Duration
	allowZeroOutputs bool
}

func (m *moeFlags) register(cmd *cobra.Command) {
	fl := cmd.Flags()
	fl.StringSliceVar(&m.dht, "dht", nil, "moe and averaging: DHT peers of the swarm to join (multiaddrs ending in /p2p/ID)")
	fl.StringSliceVar(&m.listen, "moe-listen", []string{"/ip4/127.0.0.1/tcp/0"}, "moe: trainer listen multiaddrs")
	fl.StringVar(&m.grids, "moe-grids", "ffn.4.4", "moe: one DMoE layer per grid, PREFIX.SIZE1.SIZE2… (comma-separated)")
	fl.IntVar(&m.hidden, "moe-hidden", 64, "moe: experts' hidden size")
	fl.IntVar(&m.kBest, "k-best", 4, "moe: experts per sample")
	fl.IntVar(&m.kMin, "k-min", 1, "moe: answers per sample before --timeout-after-k-min starts")
	fl.DurationVar(&m.forwardTimeout, "forward-timeout", 10*time.Second, "moe: bound on a layer's forward calls")
	fl.DurationVar(&m.afterKMin, "timeout-after-k-min", time.Second, "moe: extra wait once every sample has --k-min answers")
	fl.DurationVar(&m.backwardTimeout, "backward-timeout", 10*time.Second, "moe: bound on a layer's backward calls")
	fl.IntVar(&m.trainers, "trainers", 1, "moe: concurrent trainers in this process sharing the local layers")
	fl.DurationVar(&m.delay, "emulated-rtt", 0, "moe: add this round-trip time to every expert and DHT call")
	fl.IntVar(&m.steps, "moe-steps", 0, "moe: stop after N steps in total (0: --epochs)")
	fl.IntVar(&m.evalLimit, "eval-limit", 0, "moe: evaluate on the first N test examples (0: all)")
	fl.DurationVar(&m.cacheTTL, "dht-cache", 30*time.Second, "moe: how long beam search caches prefix records")
	fl.BoolVar(&m.allowZeroOutputs, "allow-zero-outputs", false, "moe: samples no expert answered pass zeros instead of failing the step")
}

// parseGrids parses "ffn.16.16,att.8.8".
func parseGrids(s string) ([]moe.Grid, error) {
	var out []moe.Grid
	for g := range strings.SplitSeq(s, ",") {
		parts := strings.Split(strings.TrimSpace(g), ".")
		if len(parts) < 2 {
			return nil, fmt.Errorf("grid %q: want PREFIX.SIZE[.SIZE…]", g)
		}
		grid := moe.Grid{Prefix: parts[0]}
		for _, p := range parts[1:] {
			n, err := strconv.Atoi(p)
			if err != nil {
				return nil, fmt.Errorf("grid %q: %w", g, err)
			}
			grid.Size = append(grid.Size, n)
		}
		if err := grid.Validate(); err != nil {
			return nil, err
		}
		out = append(out, grid)
	}
	return out, nil
}

// wireLimitsFor bounds decoded expert messages for batches of maxBatch rows.
func wireLimitsFor(maxBatch, hidden int) wire.Limits {
	return wire.Limits{MaxElements: min(2*maxBatch*hidden*128, 1<<26), MaxDims: 4, MaxTensors: 4}
}

// emulateRTT wraps tr so that each of its calls takes rtt longer, half on
// the request and half on the response (netem's link model).
func emulateRTT(tr p2p.Transport, rtt time.Duration) (p2p.Transport, error) {
	if rtt <= 0 {
		return tr, nil
	}
	n, err := netem.Delay(rtt / 2)
	if err != nil {
		return nil, err
	}
	return netem.NewTransport(tr, n, netem.UniformRegion)
}

// trainMoE trains a DMoE classifier with f.moe.trainers concurrent trainers
// (client.Trainer) that call experts over tr and find them through node,
// showing a progress bar and evaluating after every epoch. It returns the
// last test accuracy.
func (f *trainFlags) trainMoE(ctx context.Context, out io.Writer, grids []moe.Grid, tr p2p.Transport, node *dht.Node, trainSet, testSet *data.Dataset) (float64, error) {
	m := &f.moe
	var bar *progress.Bar // the current epoch's
	t, err := client.NewTrainer(ctx, client.TrainerConfig{
		Model: client.ModelConfig{Inputs: 784, Hidden: m.hidden, Classes: 10, Grids: grids, CacheTTL: m.cacheTTL, Seed: f.cfg.Seed,
			Layer: client.Config{KBest: m.kBest, KMin: m.kMin, ForwardTimeout: m.forwardTimeout, TimeoutAfterKMin: m.afterKMin,
				BackwardTimeout: m.backwardTimeout, AllowZeroOutputs: m.allowZeroOutputs}},
		Connect:   func(context.Context) (p2p.Transport, client.Getter, error) { return tr, node, nil },
		Trainers:  m.trainers,
		Optimizer: optim.AdamWConfig{LR: f.cfg.LR},
		Train:     trainSet, Batch: f.cfg.BatchSize, Seed: f.cfg.Seed,
		OnStep: func(_ int, s client.Stats) {
			bar.Update(int(s.Steps), s.Samples, progress.F("loss", s.MeanLoss()), progress.F("failed", float64(s.Failed)))
		},
	})
	if err != nil {
		return 0, err
	}
	if t.EpochLen() == 0 {
		return 0, fmt.Errorf("%d training examples hold no batch of --batch %d", trainSet.Len(), f.cfg.BatchSize)
	}
	if m.evalLimit > 0 && m.evalLimit < testSet.Len() {
		testSet = testSet.Slice(0, m.evalLimit)
	}
	totalSteps := int64(f.cfg.Epochs * t.EpochLen())
	if m.steps > 0 {
		totalSteps = min(totalSteps, int64(m.steps))
	}
	newBar := func(epoch int) *progress.Bar {
		return progress.New(out, fmt.Sprintf("epoch %d/%d", epoch+1, f.cfg.Epochs), t.EpochLen())
	}
	bar = newBar(0)
	reportFailures := func(s client.Stats) {
		if s.Failed > 0 {
			fmt.Fprintf(out, "\n%d of %d steps failed; first error: %v\n", s.Failed, s.Steps, s.Err)
		}
	}
	var acc float64
	err = t.TrainEpochs(ctx, client.EpochOptions{
		Epochs:   f.cfg.Epochs,
		MaxSteps: int64(m.steps),
		LR:       optim.Schedule{Peak: f.cfg.LR, Min: f.cfg.LR / 20, Warmup: min(f.cfg.Warmup, totalSteps/10), Total: totalSteps, Decay: optim.Cosine},
		OnEpoch: func(ctx context.Context, epoch int, s client.Stats) error {
			reportFailures(s)
			var err error
			if _, acc, err = t.Evaluate(ctx, testSet); err != nil {
				return err
			}
			fmt.Fprintf(out, "\nepoch %d: test accuracy %.2f%% (%d examples)\n", epoch+1, 100*acc, testSet.Len())
			bar = newBar(epoch + 1)
			return nil
		},
	})
	if err != nil && ctx.Err() == nil {
		if s := t.Stats(); s.Failed == s.Steps {
			reportFailures(s)
		}
	}
	return acc, err
}

// runMoE trains the local layers of a DMoE model against a live swarm.
func (f *trainFlags) runMoE(cmd *cobra.Command) error {
	ctx := cmd.Context()
	if len(f.moe.dht) == 0 {
		return errors.New("--mode moe needs --dht (addresses of the swarm's DHT, e.g. from `skyhive server`)")
	}
	grids, err := parseGrids(f.moe.grids)
	if err != nil {
		return err
	}
	seeds, err := parseBootstrap(f.moe.dht)
	if err != nil {
		return err
	}
	h, err := p2p.New(ctx, p2p.Config{ListenAddrs: f.moe.listen, MaxMessageBytes: 256 << 20})
	if err != nil {
		return err
	}
	defer h.Close()
	tr, err := emulateRTT(h, f.moe.delay)
	if err != nil {
		return err
	}
	node, err := dht.New(tr, dht.Config{ClientMode: true})
	if err != nil {
		return err
	}
	defer node.Close()
	if err := node.Bootstrap(ctx, seeds); err != nil {
		return fmt.Errorf("join DHT: %w", err)
	}
	trainSet, testSet, err := loadFashion(f)
	if err != nil {
		return err
	}
	out := cmd.ErrOrStderr()
	fmt.Fprintf(out, "training a DMoE classifier (%d layers, k=%d, hidden %d) with %d trainer(s) against the swarm\n",
		len(grids), f.moe.kBest, f.moe.hidden, f.moe.trainers)
	acc, err := f.trainMoE(ctx, out, grids, tr, node, trainSet, testSet)
	if err != nil {
		return err
	}
	fmt.Fprintf(cmd.OutOrStdout(), "test accuracy %.2f%%\n", 100*acc)
	return nil
}

func loadFashion(f *trainFlags) (*data.Dataset, *data.Dataset, error) {
	trainSet, err := data.LoadFashionMNIST(f.dataDir, data.Train, data.LoadOptions{Standardize: true, Limit: f.limit})
	if err != nil {
		return nil, nil, err
	}
	testSet, err := data.LoadFashionMNIST(f.dataDir, data.Test, data.LoadOptions{Standardize: true})
	if err != nil {
		return nil, nil, err
	}
	return trainSet, testSet, nil
}

// newDemoMoECmd is `skyhive demo moe`: a whole DMoE swarm on loopback.
func newDemoMoECmd() *cobra.Command {
	var (
		f       trainFlags
		servers int
		rtt     time.Duration
	)
	cmd := &cobra.Command{
		Use:   "moe",
		Short: "Start a DHT, expert servers and trainers on loopback and train a DMoE on Fashion-MNIST",
		Long: "Run a decentralized mixture of experts on this machine: a DHT bootstrap node, --servers\n" +
			"expert servers hosting the grids' experts, and --trainers trainers, all libp2p hosts on\n" +
			"loopback with an emulated round-trip time on the trainers' calls. The trainers share\n" +
			"their local layers and train on Fashion-MNIST with a progress bar.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error { return runDemoMoE(cmd, &f, servers, rtt) },
	}
	f.register(cmd)
	f.moe.register(cmd)
	fl := cmd.Flags()
	fl.IntVar(&servers, "servers", 4, "expert servers to start")
	fl.DurationVar(&rtt, "rtt", 20*time.Millisecond, "emulated round-trip time of trainer calls")
	// Demo defaults: two 8×8 grids of small experts, 8 trainers, 3 epochs.
	_ = fl.Set("moe-grids", "l0.8.8,l1.8.8")
	_ = fl.Set("moe-hidden", "64")
	_ = fl.Set("trainers", "8")
	_ = fl.Set("epochs", "3")
	_ = fl.Set("batch", "64")
	_ = fl.Set("lr", "1e-3")
	return cmd
}

func runDemoMoE(cmd *cobra.Command, f *trainFlags, servers int, rtt time.Duration) error {
	ctx := cmd.Context()
	out := cmd.ErrOrStderr()
	grids, err := parseGrids(f.moe.grids)
	if err != nil {
		return err
	}
	if servers < 1 {
		return errors.New("--servers must be at least 1")
	}
	loop := []string{"/ip4/127.0.0.1/tcp/0"}
	var closers []func()
	defer func() {
		for i := len(closers) - 1; i >= 0; i-- {
			closers[i]()
		}
	}()
	newHost := func() (*p2p.Host, *dht.Node, error) {
		h, err := p2p.New(ctx, p2p.Config{ListenAddrs: loop, MaxMessageBytes: 256 << 20})
		if err != nil {
			return nil, nil, err
		}
		n, err := dht.New(h, dht.Config{PrivKey: h.LibP2P().Peerstore().PrivKey(h.ID())})
		if err != nil {
			h.Close()
			return nil, nil, err
		}
		closers = append(closers, func() { n.Close(); h.Close() })
		return h, n, nil
	}
	boot, _, err := newHost()
	if err != nil {
		return err
	}
	seeds := []peer.AddrInfo{boot.AddrInfo()}
	fmt.Fprintf(out, "DHT bootstrap %s/p2p/%s\n", boot.AddrInfo().Addrs[0], boot.ID())
	var uids [][]string
	for _, g := range grids {
		uids = append(uids, g.UIDs())
	}
	var srvs []*server.Server
	for i := range servers {
		h, n, err := newHost()
		if err != nil {
			return err
		}
		if err := n.Bootstrap(ctx, seeds); err != nil {
			return err
		}
		var mine []string
		for _, us := range uids {
			mine = append(mine, us[i*len(us)/servers:(i+1)*len(us)/servers]...)
		}
		srv, err := server.New(server.Config{Transport: h, DHT: n, Experts: mine, Hidden: f.moe.hidden, LR: f.cfg.LR,
			Seed: f.cfg.Seed, Limits: wireLimitsFor(4096, f.moe.hidden), DeclareEvery: 20 * time.Second})
		if err != nil {
			return err
		}
		closers = append(closers, func() { srv.Close() })
		srvs = append(srvs, srv)
		if _, err := srv.Declare(ctx); err != nil {
			return err
		}
		fmt.Fprintf(out, "expert server %d: %s, %d experts\n", i, h.ID().ShortString(), len(mine))
	}
	th, tn, err := newHost()
	if err != nil {
		return err
	}
	if err := tn.Bootstrap(ctx, seeds); err != nil {
		return err
	}
	tr, err := emulateRTT(th, rtt)
	if err != nil {
		return err
	}
	trainSet, testSet, err := loadFashion(f)
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "%d trainers, %d DMoE layers of %v experts (top %d), emulated RTT %v\n",
		f.moe.trainers, len(grids), grids[0].Size, f.moe.kBest, rtt)
	start := time.Now()
	acc, err := f.trainMoE(ctx, out, grids, tr, tn, trainSet, testSet)
	if err != nil {
		return err
	}
	var reqs, batches int64
	for _, s := range srvs {
		for _, e := range s.Stats().Experts {
			reqs += e.Forward.Requests + e.Backward.Requests
			batches += e.Forward.Batches + e.Backward.Batches
		}
	}
	fmt.Fprintf(cmd.OutOrStdout(), "test accuracy %.2f%% after %.0fs; servers answered %d expert calls in %d batches\n",
		100*acc, time.Since(start).Seconds(), reqs, batches)
	return nil
}
