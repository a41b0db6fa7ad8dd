package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/core/protocol"
	"github.com/spf13/cobra"

	"github.com/skyhive/skyhive/clock"
	"github.com/skyhive/skyhive/data"
	"github.com/skyhive/skyhive/dht"
	"github.com/skyhive/skyhive/moe"
	"github.com/skyhive/skyhive/moe/client"
	"github.com/skyhive/skyhive/moe/server"
	"github.com/skyhive/skyhive/nn"
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

// delayTransport adds an emulated round-trip time to every call.
type delayTransport struct {
	p2p.Transport
	half time.Duration
}

func (d delayTransport) Call(ctx context.Context, to peer.AddrInfo, proto protocol.ID, req []byte) ([]byte, error) {
	if err := clock.Sleep(ctx, d.half); err != nil {
		return nil, err
	}
	resp, err := d.Transport.Call(ctx, to, proto, req)
	if err != nil {
		return nil, err
	}
	if err := clock.Sleep(ctx, d.half); err != nil {
		return nil, err
	}
	return resp, nil
}

// moeTrainer is a DMoE training run against a live swarm.
type moeTrainer struct {
	f       *trainFlags
	grids   []moe.Grid
	tr      p2p.Transport
	node    *dht.Node
	shared  *client.Shared
	master  *client.Model
	opt     *optim.AdamW
	models  []*client.Model
	evalM   *client.Model
	trainDS *data.Dataset
	testDS  *data.Dataset
}

func (t *moeTrainer) newModel(allowZero bool) (*client.Model, error) {
	m := &t.f.moe
	var layers []client.Config
	for _, g := range t.grids {
		bs, err := client.NewBeamSearch(t.node, g, m.kBest, m.cacheTTL)
		if err != nil {
			return nil, err
		}
		layers = append(layers, client.Config{In: m.hidden, Search: bs, Transport: t.tr, KBest: m.kBest, KMin: m.kMin,
			ForwardTimeout: m.forwardTimeout, TimeoutAfterKMin: m.afterKMin, BackwardTimeout: m.backwardTimeout,
			AllowZeroOutputs: allowZero})
	}
	return client.NewModel(784, m.hidden, 10, layers, t.f.cfg.Seed)
}

// run trains with f.moe.trainers concurrent trainers that share the local
// layers, showing a progress bar, and evaluates after every epoch.
func (t *moeTrainer) run(ctx context.Context, out io.Writer) (float64, error) {
	f := t.f
	var err error
	t.master, err = t.newModel(false)
	if err != nil {
		return 0, err
	}
	t.opt = optim.NewAdamW(t.master.Params(), optim.AdamWConfig{LR: f.cfg.LR})
	t.shared = client.NewShared(t.master, t.opt)
	n := max(f.moe.trainers, 1)
	for range n {
		m, err := t.newModel(f.moe.allowZeroOutputs)
		if err != nil {
			return 0, err
		}
		t.models = append(t.models, m)
	}
	if t.evalM, err = t.newModel(true); err != nil {
		return 0, err
	}
	loader, err := data.NewLoader(t.trainDS, data.BatchOptions{Size: f.cfg.BatchSize, Shuffle: true, Seed: f.cfg.Seed, DropLast: true})
	if err != nil {
		return 0, err
	}
	testDS := t.testDS
	if f.moe.evalLimit > 0 && f.moe.evalLimit < testDS.Len() {
		testDS = testDS.Slice(0, f.moe.evalLimit)
	}
	totalSteps := int64(f.cfg.Epochs * loader.Len())
	if f.moe.steps > 0 {
		totalSteps = min(totalSteps, int64(f.moe.steps))
	}
	sched := optim.Schedule{Peak: f.cfg.LR, Min: f.cfg.LR / 20, Warmup: min(f.cfg.Warmup, totalSteps/10), Total: totalSteps, Decay: optim.Cosine}
	var acc float64
	var total atomic.Int64
	for epoch := range f.cfg.Epochs {
		bar := progress.New(out, fmt.Sprintf("epoch %d/%d", epoch+1, f.cfg.Epochs), loader.Len())
		batches := make(chan data.Batch)
		var (
			mu                 sync.Mutex
			done, failed, seen int
			lossSum            float64
			firstErr           error
		)
		ectx, cancel := context.WithCancel(ctx)
		var wg sync.WaitGroup
		for _, m := range t.models {
			wg.Go(func() {
				ps := m.Params()
				for b := range batches {
					nn.ZeroGrad(ps)
					d, loss, _, err := m.StepDeferred(ectx, b.X, b.Y)
					mu.Lock()
					done++
					if err != nil {
						failed++
						if firstErr == nil {
							firstErr = err
						}
					} else {
						seen += b.Len()
						lossSum += float64(loss)
					}
					bar.Update(done, int64(seen), progress.F("loss", lossSum/float64(max(done-failed, 1))), progress.F("failed", float64(failed)))
					mu.Unlock()
					if err == nil {
						t.shared.SetLR(sched.LR(t.shared.Steps()))
						t.shared.Apply(m, d)
					}
				}
			})
		}
	feed:
		for _, b := range loader.Epoch(epoch) {
			if f.moe.steps > 0 && total.Load() >= int64(f.moe.steps) {
				break
			}
			select {
			case batches <- b:
				total.Add(1)
			case <-ctx.Done():
				break feed
			}
		}
		close(batches)
		wg.Wait()
		cancel()
		if ctx.Err() != nil {
			return acc, ctx.Err()
		}
		if failed > 0 {
			fmt.Fprintf(out, "\n%d of %d steps failed; first error: %v\n", failed, done, firstErr)
		}
		if failed == done && done > 0 {
			return acc, fmt.Errorf("every step failed: %w", firstErr)
		}
		t.shared.Sync(t.evalM)
		_, acc, err = t.evalM.Evaluate(ctx, testDS, 500, 4)
		if err != nil {
			return acc, fmt.Errorf("evaluate: %w", err)
		}
		fmt.Fprintf(out, "\nepoch %d: test accuracy %.2f%% (%d examples)\n", epoch+1, 100*acc, testDS.Len())
		if f.moe.steps > 0 && total.Load() >= int64(f.moe.steps) {
			break
		}
	}
	return acc, nil
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
	var tr p2p.Transport = h
	if f.moe.delay > 0 {
		tr = delayTransport{Transport: h, half: f.moe.delay / 2}
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
	t := &moeTrainer{f: f, grids: grids, tr: tr, node: node, trainDS: trainSet, testDS: testSet}
	acc, err := t.run(ctx, out)
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
	var tr p2p.Transport = th
	if rtt > 0 {
		tr = delayTransport{Transport: th, half: rtt / 2}
	}
	trainSet, testSet, err := loadFashion(f)
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "%d trainers, %d DMoE layers of %v experts (top %d), emulated RTT %v\n",
		f.moe.trainers, len(grids), grids[0].Size, f.moe.kBest, rtt)
	t := &moeTrainer{f: f, grids: grids, tr: tr, node: tn, trainDS: trainSet, testDS: testSet}
	start := time.Now()
	acc, err := t.run(ctx, out)
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
