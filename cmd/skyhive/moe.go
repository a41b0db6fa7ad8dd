package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/skyhive/skyhive/data"
	"github.com/skyhive/skyhive/dht"
	"github.com/skyhive/skyhive/metrics"
	"github.com/skyhive/skyhive/moe"
	"github.com/skyhive/skyhive/moe/client"
	"github.com/skyhive/skyhive/moe/server"
	"github.com/skyhive/skyhive/netem"
	"github.com/skyhive/skyhive/optim"
	"github.com/skyhive/skyhive/p2p"
	"github.com/skyhive/skyhive/progress"
	"github.com/skyhive/skyhive/text"
	"github.com/skyhive/skyhive/train"
	"github.com/skyhive/skyhive/wire"
)

// moeFlags are the options of train moe and demo moe: the trainers, the
// DMoE layers and how they call experts.
type moeFlags struct {
	train            trainFlags
	grids            string
	hidden           int
	kBest, kMin      int
	forwardTimeout   time.Duration
	afterKMin        time.Duration
	backwardTimeout  time.Duration
	trainers         int
	evalLimit        int
	cacheTTL         time.Duration
	allowZeroOutputs bool
	// maxFailed is --max-failed-steps: the fraction of steps that may
	// fail before the run counts as failed.
	maxFailed float64
	link      linkFlags
	rtt       time.Duration // retired --rtt and --emulated-rtt
	// dataset is --data: Fashion-MNIST for a DMoE classifier, text for a
	// DMoE transformer language model (moeLMFlags).
	dataset string
	lm      moeLMFlags
	// live receives the training numbers for the status record (nil:
	// none is published).
	live *metrics.Live
	// tm receives the training numbers for --metrics (nil: none).
	tm *metrics.Training
}

// moeLMFlags are the options of a DMoE language model (--data gcide).
type moeLMFlags struct {
	lmDataFlags
	heads int
	clip  float64
}

// register adds the flags of both MoE commands; latency is the default
// one-way latency of the trainers' calls.
func (m *moeFlags) register(fl *pflag.FlagSet, latency time.Duration) {
	m.train.register(fl)
	m.train.out.register(fl, "the result (accuracy, steps, failures)", "one per epoch")
	fl.IntVar(&m.train.steps, "steps", 0, "stop after N steps in total (0: --epochs)")
	fl.StringVar(&m.grids, "grids", "ffn.4.4", "one DMoE layer per grid, PREFIX.SIZE1.SIZE2… (comma-separated)")
	fl.IntVar(&m.hidden, "hidden", server.DefaultHidden, "experts' hidden size (train moe without --hidden: what the swarm's experts declare on the DHT)")
	fl.IntVar(&m.kBest, "k-best", 4, "experts per sample")
	fl.IntVar(&m.kMin, "k-min", 1, "answers per sample before --timeout-after-k-min starts")
	fl.DurationVar(&m.forwardTimeout, "forward-timeout", 10*time.Second, "bound on a layer's forward calls")
	fl.DurationVar(&m.afterKMin, "timeout-after-k-min", time.Second, "extra wait once every sample has --k-min answers")
	fl.DurationVar(&m.backwardTimeout, "backward-timeout", 10*time.Second, "bound on a layer's backward calls")
	fl.IntVar(&m.trainers, "trainers", 1, "concurrent trainers in this process sharing the local layers")
	fl.IntVar(&m.evalLimit, "eval-limit", 0, "evaluate on the first N test examples (0: all)")
	fl.DurationVar(&m.cacheTTL, "dht-cache", 30*time.Second, "how long beam search caches prefix records")
	fl.BoolVar(&m.allowZeroOutputs, "allow-zero-outputs", false, "samples no expert answered pass zeros instead of failing the step")
	fl.Float64Var(&m.maxFailed, "max-failed-steps", defaultMaxFailed, "fraction of steps that may fail (no expert answered): a run with more failed steps exits with an error")
	m.link.register(fl, "of every expert and DHT call of the trainers, each way", latency)
	fl.DurationVar(&m.rtt, "rtt", 0, "retired: use --latency, the one-way latency (half the round trip)")
	_ = fl.MarkDeprecated("rtt", "use --latency with the one-way latency (half of --rtt)")
	fl.StringVar(&m.dataset, "data", "fashion-mnist", "fashion-mnist (a DMoE classifier) or text for a DMoE transformer language model: "+train.TextDataUsage)
	m.lm.lmDataFlags.register(fl, 20000)
	fl.IntVar(&m.lm.heads, "heads", 2, "language model: attention heads (dividing --hidden)")
	fl.Float64Var(&m.lm.clip, "clip", 1, "language model: global norm clip of the local gradients (0 disables)")
	renameFlags(fl, map[string]string{"moe-grids": "grids", "moe-hidden": "hidden", "moe-steps": "steps", "moe-listen": "listen", "emulated-rtt": "rtt"})
}

// setup checks the flags both MoE commands share and reads what they
// train on: the grids, the trainers' emulated link and the data.
func (m *moeFlags) setup(out io.Writer) ([]moe.Grid, netem.LinkParams, moeData, error) {
	if m.maxFailed > 1 {
		return nil, netem.LinkParams{}, moeData{}, fmt.Errorf("--max-failed-steps %g: a fraction of the steps, at most 1", m.maxFailed)
	}
	grids, err := parseGrids(m.grids)
	if err != nil {
		return nil, netem.LinkParams{}, moeData{}, fmt.Errorf("--grids: %w", err)
	}
	link, err := m.emulated()
	if err != nil {
		return nil, netem.LinkParams{}, moeData{}, err
	}
	d, err := m.loadData(out)
	return grids, link, d, err
}

// moeNumbers are the MoE commands' rules for numeric flags.
var moeNumbers = numberRules{Positive: []string{"epochs", "batch", "lr", "hidden", "k-best", "k-min", "trainers", "heads", "seq", "servers"}}

// emulated returns the trainers' link: --latency and --bandwidth, or half
// of a retired --rtt.
func (m *moeFlags) emulated() (netem.LinkParams, error) {
	if m.rtt != 0 {
		m.link.latency = m.rtt / 2
	}
	return m.link.params()
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

// emulateLink wraps tr so that each request and each response crosses
// link (netem's link model); a zero link leaves tr as it is.
func emulateLink(tr p2p.Transport, link netem.LinkParams, seed uint64) (p2p.Transport, error) {
	if link == (netem.LinkParams{}) {
		return tr, nil
	}
	n, err := netem.New(netem.Uniform(link), seed)
	if err != nil {
		return nil, err
	}
	return netem.NewTransport(tr, n, netem.UniformRegion)
}

// moeEpoch is one --stats line of the MoE commands.
type moeEpoch struct {
	Epoch        int     `json:"epoch"`
	Steps        int64   `json:"steps"`
	Failed       int64   `json:"failed_steps"`
	Samples      int64   `json:"samples"`
	TrainLoss    float64 `json:"train_loss"`
	TestAccuracy float64 `json:"test_accuracy"`
	Seconds      float64 `json:"seconds"`
}

// moeResult is what --json prints.
type moeResult struct {
	TestAccuracy float64    `json:"test_accuracy"`
	Steps        int64      `json:"steps"`
	Failed       int64      `json:"failed_steps"`
	Seconds      float64    `json:"seconds"`
	Epochs       []moeEpoch `json:"epochs"`
	// ExpertCalls and ExpertBatches count what the servers answered
	// (demo moe only).
	ExpertCalls   int64 `json:"expert_calls,omitempty"`
	ExpertBatches int64 `json:"expert_batches,omitempty"`
	// firstErr is the first failed step's error.
	firstErr error
	// A language model (--data gcide) reports its data, vocabulary,
	// training loss and validation loss and perplexity instead of a test
	// accuracy.
	Data          string  `json:"data,omitempty"`
	Vocab         int     `json:"vocab,omitempty"`
	EvalTokens    int     `json:"eval_tokens,omitempty"`
	TrainLoss     float64 `json:"train_loss,omitempty"`
	ValLoss       float64 `json:"val_loss,omitempty"`
	ValPerplexity float64 `json:"val_perplexity,omitempty"`
}

// trainMoE trains a DMoE classifier with m.trainers concurrent trainers
// (client.Trainer) that call experts over tr and find them through node,
// showing a progress bar and evaluating after every epoch.
func (m *moeFlags) trainMoE(ctx context.Context, out io.Writer, grids []moe.Grid, tr p2p.Transport, node *dht.Node, trainSet, testSet *data.Dataset) (moeResult, error) {
	f := &m.train
	var res moeResult
	stats, closeStats, err := f.out.openStats()
	if err != nil {
		return res, err
	}
	defer closeStats()
	lines := jsonLines{w: stats}

	// The epoch and its samples at m.tm's last step.
	tmEpoch, tmSamples := 0, int64(0)
	var bar *progress.Bar // the current epoch's
	// The finished epochs' steps and samples, for m.live (under its lock).
	var doneSteps, doneSamples int64
	t, err := client.NewTrainer(ctx, client.TrainerConfig{
		Model: client.ModelConfig{Inputs: 784, Hidden: m.hidden, Classes: 10, Grids: grids, CacheTTL: m.cacheTTL, Seed: f.cfg.Seed,
			Layer: client.Config{KBest: m.kBest, KMin: m.kMin, ForwardTimeout: m.forwardTimeout, TimeoutAfterKMin: m.afterKMin,
				BackwardTimeout: m.backwardTimeout, AllowZeroOutputs: m.allowZeroOutputs}},
		Connect:   func(context.Context) (p2p.Transport, client.Getter, error) { return tr, node, nil },
		Trainers:  m.trainers,
		Optimizer: optim.AdamWConfig{LR: f.cfg.LR, WeightDecay: f.cfg.WeightDecay},
		Train:     trainSet, Batch: f.cfg.BatchSize, Seed: f.cfg.Seed,
		OnStep: func(epoch int, s client.Stats) {
			bar.Update(int(s.Steps), s.Samples, progress.F("loss", s.MeanLoss()), progress.F("failed", float64(s.Failed)))
			if epoch != tmEpoch {
				tmEpoch, tmSamples = epoch, 0
			}
			m.tm.Step(int(s.Samples-tmSamples), s.MeanLoss())
			tmSamples = s.Samples
			m.live.Update(func(l *metrics.Status) {
				l.Step, l.Samples, l.Loss = doneSteps+s.Steps, doneSamples+s.Samples, metrics.Float(s.MeanLoss())
			})
		},
	})
	if err != nil {
		return res, err
	}
	if t.EpochLen() == 0 {
		return res, fmt.Errorf("%d training examples hold no batch of --batch %d", trainSet.Len(), f.cfg.BatchSize)
	}
	if m.evalLimit > 0 && m.evalLimit < testSet.Len() {
		testSet = testSet.Slice(0, m.evalLimit)
	}
	totalSteps := int64(f.cfg.Epochs * t.EpochLen())
	if f.steps > 0 {
		totalSteps = min(totalSteps, int64(f.steps))
	}
	newBar := func(epoch int) *progress.Bar {
		return progress.New(out, fmt.Sprintf("epoch %d/%d", epoch+1, f.cfg.Epochs), t.EpochLen())
	}
	bar = newBar(0)
	start := time.Now()
	err = t.TrainEpochs(ctx, client.EpochOptions{
		Epochs:   f.cfg.Epochs,
		MaxSteps: int64(f.steps),
		LR:       optim.Schedule{Peak: f.cfg.LR, Min: f.cfg.LR / 20, Warmup: min(f.cfg.Warmup, totalSteps/10), Total: totalSteps, Decay: optim.Cosine},
		OnEpoch: func(ctx context.Context, epoch int, s client.Stats) error {
			if s.Failed > 0 {
				fmt.Fprintf(out, "\nepoch %d: %d of %d steps failed", epoch+1, s.Failed, s.Steps)
				if res.firstErr == nil {
					res.firstErr = s.Err
				}
			}
			testLoss, acc, err := t.Evaluate(ctx, testSet)
			if err != nil {
				return err
			}
			m.tm.Eval(testLoss, acc)
			fmt.Fprintf(out, "\nepoch %d: test accuracy %.2f%% (%d examples)\n", epoch+1, 100*acc, testSet.Len())
			m.live.Update(func(l *metrics.Status) {
				doneSteps, doneSamples = doneSteps+s.Steps, doneSamples+s.Samples
				l.Accuracy = metrics.Float(acc)
			})
			e := moeEpoch{Epoch: epoch + 1, Steps: s.Steps, Failed: s.Failed, Samples: s.Samples, TrainLoss: s.MeanLoss(),
				TestAccuracy: acc, Seconds: s.Elapsed.Seconds()}
			res.Epochs = append(res.Epochs, e)
			res.TestAccuracy = acc
			res.Steps += s.Steps
			res.Failed += s.Failed
			lines.write(e)
			bar = newBar(epoch + 1)
			return nil
		},
	})
	res.Seconds = time.Since(start).Seconds()
	if err == nil && lines.err != nil {
		err = fmt.Errorf("--stats: %w", lines.err)
	}
	return res, err
}

// report prints res: as JSON with --json, else as a sentence.
func (m *moeFlags) report(w io.Writer, res moeResult) error {
	if m.train.out.json {
		return printJSON(w, res)
	}
	if res.ValPerplexity > 0 {
		fmt.Fprintf(w, "validation perplexity %.1f (loss %.3f on %d tokens) after %d steps (%d failed) in %.0fs",
			res.ValPerplexity, res.ValLoss, res.EvalTokens, res.Steps, res.Failed, res.Seconds)
	} else {
		fmt.Fprintf(w, "test accuracy %.2f%% after %d steps (%d failed) in %.0fs", 100*res.TestAccuracy, res.Steps, res.Failed, res.Seconds)
	}
	if res.ExpertCalls > 0 {
		fmt.Fprintf(w, "; servers answered %d expert calls in %d batches", res.ExpertCalls, res.ExpertBatches)
	}
	fmt.Fprintln(w)
	return nil
}

// defaultMaxFailed is the default --max-failed-steps: a run in which more
// than a tenth of the steps failed has failed.
const defaultMaxFailed = 0.1

// checkFailures is the verdict on a finished run: an error when more than
// --max-failed-steps of its steps failed, counting them and giving the
// first failure's cause once; a note on log when fewer did.
func (m *moeFlags) checkFailures(log io.Writer, res moeResult) error {
	if res.Failed == 0 {
		return nil
	}
	frac := float64(res.Failed) / float64(max(res.Steps, 1))
	if frac > m.maxFailed {
		return fmt.Errorf("%d of %d steps failed (%.0f%%, more than --max-failed-steps %g); the first failure: %w",
			res.Failed, res.Steps, 100*frac, m.maxFailed, res.firstErr)
	}
	fmt.Fprintf(log, "%d of %d steps failed (within --max-failed-steps %g); the first failure: %v\n", res.Failed, res.Steps, m.maxFailed, res.firstErr)
	return nil
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
		RunE: func(cmd *cobra.Command, _ []string) error { return m.run(cmd) },
	}
	cmd.PreRunE = checkedNumbers(moeNumbers)
	fl := cmd.Flags()
	m.register(fl, 0)
	m.net.register(fl, "DHT peers of the swarm to join: multiaddrs ending in /p2p/PEER_ID (required)")
	m.status.register(fl)
	m.train.metrics.register(fl)
	return cmd
}

// run trains the local layers of a DMoE model against a live swarm.
func (m *moeTrainFlags) run(cmd *cobra.Command) error {
	ctx := cmd.Context()
	if len(m.net.dht) == 0 {
		return errors.New("--dht is required: the address of the swarm's DHT, e.g. printed by `skyhive server` or `skyhive dht`")
	}
	grids, link, d, err := m.setup(cmd.ErrOrStderr())
	if err != nil {
		return err
	}
	if err := m.status.check(); err != nil {
		return err
	}
	seeds, err := m.net.seeds()
	if err != nil {
		return err
	}
	hcfg, err := m.net.config()
	if err != nil {
		return err
	}
	hcfg.MaxMessageBytes = 256 << 20
	reg, stopMetrics, err := m.train.metrics.start(ctx, cmd.ErrOrStderr())
	if err != nil {
		return err
	}
	defer stopMetrics()
	if m.tm, err = metrics.NewTraining(reg.Registerer()); err != nil {
		return err
	}
	defer m.tm.Close()
	hcfg.Metrics = reg.Registerer()
	h, err := p2p.New(ctx, hcfg)
	if err != nil {
		return err
	}
	defer h.Close()
	reportReach(ctx, h, cmd.ErrOrStderr(), nil)
	tr, err := emulateLink(h, link, m.train.cfg.Seed)
	if err != nil {
		return err
	}
	// The key signs this trainer's status record.
	node, err := dht.New(tr, dht.Config{ClientMode: true, PrivKey: h.LibP2P().Peerstore().PrivKey(h.ID()), Metrics: reg.Registerer()})
	if err != nil {
		return err
	}
	defer node.Close()
	if err := node.Bootstrap(ctx, seeds); err != nil {
		return fmt.Errorf("join DHT: %w", err)
	}
	out := cmd.ErrOrStderr()
	if err := m.matchExperts(ctx, out, node, grids, cmd.Flags().Changed("hidden")); err != nil {
		return err
	}
	m.live = &metrics.Live{}
	defer m.status.start(ctx, cmd.ErrOrStderr(), h, node, metrics.RoleTrainer, m.live.Sample)()
	res, err := m.trainOn(ctx, out, d, grids, tr, node)
	if err != nil {
		return err
	}
	if err := m.report(cmd.OutOrStdout(), res); err != nil {
		return err
	}
	return m.checkFailures(out, res)
}

// expertsWait bounds how long train moe waits for the grids' experts to be
// declared before it starts training without checking them.
const expertsWait = 10 * time.Second

// matchExperts reads what the grids' experts declare on the DHT (their type
// and hidden size; client.Declared) and makes the model fit them: without
// an explicit --hidden it takes the experts' hidden size, and it refuses,
// naming the flag to change, experts of another type, experts of several
// sizes, or a --hidden that differs from theirs. It waits up to
// expertsWait for the first declarations; servers that declare neither
// type nor size are not checked.
func (m *moeFlags) matchExperts(ctx context.Context, out io.Writer, node client.Getter, grids []moe.Grid, hiddenSet bool) error {
	var infos []moe.ExpertInfo
	deadline := time.Now().Add(expertsWait)
	for _, g := range grids {
		for {
			found, err := client.Declared(ctx, node, g)
			if err != nil && ctx.Err() != nil {
				return ctx.Err()
			}
			if len(found) > 0 || time.Now().After(deadline) {
				infos = append(infos, found...)
				break
			}
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(200 * time.Millisecond):
			}
		}
	}
	if len(infos) == 0 {
		fmt.Fprintf(out, "no experts of --grids %s are declared on the DHT yet: training with --hidden %d\n", m.grids, m.hidden)
		return nil
	}
	sized := map[int]moe.ExpertInfo{} // an expert of each declared size
	for _, e := range infos {
		if e.Type != "" && e.Type != server.TypeFFN {
			return fmt.Errorf("expert %s on %s is a %s expert, but a DMoE trainer calls %s experts: start its server with --expert-type %s, or choose other --grids",
				e.UID, e.Peer.ID.ShortString(), e.Type, server.TypeFFN, server.TypeFFN)
		}
		if e.Hidden > 0 {
			sized[e.Hidden] = e
		}
	}
	if len(sized) > 1 {
		var sizes []string
		for h, e := range sized {
			sizes = append(sizes, fmt.Sprintf("%s has hidden %d", e.UID, h))
		}
		slices.Sort(sizes)
		return fmt.Errorf("the experts of --grids %s differ in size (%s): start the servers with the same --hidden", m.grids, strings.Join(sizes, ", "))
	}
	for h, e := range sized {
		switch {
		case h == m.hidden:
		case hiddenSet:
			return fmt.Errorf("--hidden %d, but expert %s on %s has hidden %d: pass --hidden %d (or leave it out), or start the servers with --hidden %d",
				m.hidden, e.UID, e.Peer.ID.ShortString(), h, h, m.hidden)
		default:
			fmt.Fprintf(out, "the swarm's experts have hidden size %d: the model uses it (--hidden)\n", h)
			m.hidden = h
		}
	}
	return nil
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
		RunE: func(cmd *cobra.Command, _ []string) error { return runDemoMoE(cmd, &m, servers) },
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

func runDemoMoE(cmd *cobra.Command, m *moeFlags, servers int) error {
	ctx := cmd.Context()
	out := cmd.ErrOrStderr()
	f := &m.train
	if servers < 1 {
		return errors.New("--servers must be at least 1")
	}
	grids, link, d, err := m.setup(out)
	if err != nil {
		return err
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
		srv, err := server.NewContext(ctx, server.Config{Transport: h, DHT: n, Experts: mine, Hidden: m.hidden, LR: f.cfg.LR,
			Seed: f.cfg.Seed, Limits: wireLimitsFor(4096, m.hidden), DeclareEvery: 20 * time.Second})
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
	tr, err := emulateLink(th, link, f.cfg.Seed)
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "%d DMoE layers of %v experts (top %d), emulated one-way latency %v\n",
		len(grids), grids[0].Size, m.kBest, link.Latency)
	res, err := m.trainOn(ctx, out, d, grids, tr, tn)
	if err != nil {
		return err
	}
	for _, s := range srvs {
		for _, e := range s.Stats().Experts {
			res.ExpertCalls += e.Forward.Requests + e.Backward.Requests
			res.ExpertBatches += e.Forward.Batches + e.Backward.Batches
		}
	}
	if err := m.report(cmd.OutOrStdout(), res); err != nil {
		return err
	}
	return m.checkFailures(out, res)
}

// moeData is what a MoE command trains on: Fashion-MNIST for a DMoE
// classifier, or the tokens of a DMoE language model.
type moeData struct {
	trainSet, testSet *data.Dataset
	lm                *moeCorpus
}

// moeCorpus is a tokenized text corpus split for training and validation.
type moeCorpus struct {
	name       string
	vocab      int
	train, val []int32
}

// loadData reads --data: Fashion-MNIST, or a text corpus that it
// tokenizes as every language-model command does (train.Tokenize: a
// byte-level BPE of --vocab tokens trained on it, a tenth for validation,
// of which the first --eval-tokens are evaluated).
func (m *moeFlags) loadData(out io.Writer) (moeData, error) {
	if !train.IsTextData(m.dataset) {
		if m.dataset != "fashion-mnist" {
			return moeData{}, fmt.Errorf("--data %q: want fashion-mnist or text (%s)", m.dataset, train.TextDataUsage)
		}
		trainSet, testSet, err := m.train.data.load()
		return moeData{trainSet: trainSet, testSet: testSet}, err
	}
	switch {
	case m.lm.seq < 1 || m.lm.heads < 1 || m.hidden%m.lm.heads != 0:
		return moeData{}, fmt.Errorf("--seq %d and --heads %d must be positive, and --heads must divide --hidden %d", m.lm.seq, m.lm.heads, m.hidden)
	case m.lm.evalTokens < 0 || m.lm.clip < 0:
		return moeData{}, errors.New("--eval-tokens and --clip must not be negative")
	}
	corpus, err := train.LoadCorpus(m.dataset, m.lm.corpusBytes, m.lm.tokenWidth, m.lm.vocab)
	if err != nil {
		return moeData{}, err
	}
	d, err := train.Tokenize(corpus, train.TokenizeOptions{Vocab: m.lm.vocab, Seed: m.train.cfg.Seed, Log: out})
	if err != nil {
		return moeData{}, fmt.Errorf("--data %s: %w", corpus.Name, err)
	}
	if err := d.CheckContext(m.lm.seq); err != nil {
		return moeData{}, fmt.Errorf("--data %s: %w", corpus.Name, err)
	}
	val, err := d.EvalIDs(m.lm.evalTokens, m.lm.seq)
	if err != nil {
		return moeData{}, fmt.Errorf("--data %s: %w", corpus.Name, err)
	}
	return moeData{lm: &moeCorpus{name: corpus.Name, vocab: d.Vocab, train: d.Train, val: val}}, nil
}

// trainOn trains the model d calls for: a classifier or a language model.
func (m *moeFlags) trainOn(ctx context.Context, out io.Writer, d moeData, grids []moe.Grid, tr p2p.Transport, node *dht.Node) (moeResult, error) {
	if d.lm != nil {
		fmt.Fprintf(out, "training a DMoE language model (%d blocks, k=%d, hidden %d, vocab %d, seq %d) against the swarm\n",
			len(grids), m.kBest, m.hidden, d.lm.vocab, m.lm.seq)
		if m.trainers > 1 {
			fmt.Fprintf(out, "one trainer: --trainers %d applies to classifiers\n", m.trainers)
		}
		return m.trainLM(ctx, out, grids, tr, node, d.lm)
	}
	fmt.Fprintf(out, "training a DMoE classifier (%d layers, k=%d, hidden %d) with %d trainer(s) against the swarm\n",
		len(grids), m.kBest, m.hidden, m.trainers)
	return m.trainMoE(ctx, out, grids, tr, node, d.trainSet, d.testSet)
}

// moeLMSteps is the training length of a language model without --steps.
const moeLMSteps = 300

// trainLM trains a DMoE transformer language model (client.LM) whose
// blocks' feed-forward sub-blocks are the grids' experts, one trainer
// stepping at a time (client.TrainLM), then reports its validation
// perplexity.
func (m *moeFlags) trainLM(ctx context.Context, out io.Writer, grids []moe.Grid, tr p2p.Transport, node *dht.Node, c *moeCorpus) (moeResult, error) {
	f := &m.train
	res := moeResult{Data: c.name, Vocab: c.vocab}
	steps := int64(f.steps)
	if steps <= 0 {
		steps = moeLMSteps
	}
	lm, err := client.LMConfig{
		Vocab: c.vocab, Seq: m.lm.seq, Hidden: m.hidden, Heads: m.lm.heads, Grids: grids, CacheTTL: m.cacheTTL, Seed: f.cfg.Seed,
		Layer: client.Config{KBest: m.kBest, KMin: m.kMin, ForwardTimeout: m.forwardTimeout, TimeoutAfterKMin: m.afterKMin,
			BackwardTimeout: m.backwardTimeout, AllowZeroOutputs: m.allowZeroOutputs},
	}.Build(node, tr)
	if err != nil {
		return res, err
	}
	sampler, err := text.NewSampler(c.train, f.cfg.BatchSize, m.lm.seq, f.cfg.Seed)
	if err != nil {
		return res, err
	}
	stats, closeStats, err := f.out.openStats()
	if err != nil {
		return res, err
	}
	defer closeStats()
	lines := jsonLines{w: stats}
	opt := optim.NewAdamW(lm.Params(), optim.AdamWConfig{LR: f.cfg.LR, WeightDecay: f.cfg.WeightDecay, NoDecay: optim.NoDecayVectors})
	bar := progress.New(out, "steps", int(steps))
	var sum float64
	var n int64
	tokens := int64(f.cfg.BatchSize * m.lm.seq)
	start := time.Now()
	st, err := client.TrainLM(ctx, lm, opt, sampler, client.LMTrainConfig{
		Steps:    steps,
		LR:       optim.Schedule{Peak: f.cfg.LR, Min: f.cfg.LR / 10, Warmup: min(f.cfg.Warmup, steps/10), Total: steps, Decay: optim.Cosine},
		ClipNorm: m.lm.clip,
		OnStep: func(step int64, loss float64, err error) {
			if !math.IsNaN(loss) {
				sum += loss
				n++
			}
			if err == nil {
				m.tm.Step(f.cfg.BatchSize, loss)
			}
			bar.Update(int(step+1), (step+1)*tokens, progress.F("loss", sum/float64(max(n, 1))))
			m.live.Update(func(l *metrics.Status) {
				l.Step, l.Samples = step+1, (step+1)*int64(f.cfg.BatchSize)
				if !math.IsNaN(loss) {
					l.Loss = metrics.Float(loss)
				}
			})
			if (step+1)%max(steps/10, 1) == 0 {
				lines.write(moeEpoch{Steps: step + 1, TrainLoss: sum / float64(max(n, 1)), Seconds: time.Since(start).Seconds()})
				sum, n = 0, 0
			}
		},
	})
	res.Steps, res.Failed, res.TrainLoss, res.firstErr = st.Steps, st.Failed, st.LastLoss, st.Err
	res.Seconds = time.Since(start).Seconds()
	if err != nil {
		return res, err
	}
	seq := min(m.lm.seq, len(c.val)-1)
	vl, err := lm.Evaluate(ctx, c.val, seq, f.cfg.BatchSize)
	if err != nil {
		return res, fmt.Errorf("validation: %w", err)
	}
	res.ValLoss, res.ValPerplexity = vl, math.Exp(vl)
	m.tm.Eval(vl, math.NaN())
	res.EvalTokens = (len(c.val) - 1) / seq * seq
	fmt.Fprintln(out)
	if lines.err != nil {
		return res, fmt.Errorf("--stats: %w", lines.err)
	}
	return res, nil
}
