// Package peer runs one group-averaging peer: a process of its own with a
// libp2p host, a DHT node joined to the swarm, its replica of a model, its
// shard of the data and its real compute speed, training with its own loop
// and an optimizer.Optimizer that averages with the other peers of the run.
// `skyhive peer` is a thin shell around FromLaunch and RunRole (ConfigFrom
// and Run, with the peer's status record and result); `skyhive train
// averaging` launches several on one machine with RunLocal (over Launch).
package peer

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"path/filepath"
	"slices"
	"strings"
	"time"

	libp2ppeer "github.com/libp2p/go-libp2p/core/peer"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/skyhive/skyhive/averaging"
	"github.com/skyhive/skyhive/averaging/optimizer"
	"github.com/skyhive/skyhive/checkpoint"
	"github.com/skyhive/skyhive/clock"
	"github.com/skyhive/skyhive/dht"
	"github.com/skyhive/skyhive/metrics"
	"github.com/skyhive/skyhive/models"
	"github.com/skyhive/skyhive/node"
	"github.com/skyhive/skyhive/p2p"
	"github.com/skyhive/skyhive/swarm"
	"github.com/skyhive/skyhive/train"
	"github.com/skyhive/skyhive/wire"
)

// Config configures a peer. Zero fields take the defaults noted.
type Config struct {
	// Host configures the peer's libp2p host: listen and announce
	// addresses (default all interfaces, TCP and QUIC, on free ports),
	// identity file, relays and NAT traversal. Run sets its message limit.
	Host p2p.Config
	// Reach, if set, is called with where others reach the peer, now and
	// whenever AutoNAT's verdict changes.
	Reach func(p2p.Reach)
	// DHT are the swarm's DHT peers to join (required).
	DHT []libp2ppeer.AddrInfo
	// DHTMaxBytes bounds the records this peer's DHT node stores for
	// others (dht.Config.MaxBytes; 0: dht's default).
	DHTMaxBytes int
	// JoinTimeout bounds joining the DHT (30 s).
	JoinTimeout time.Duration
	// RunID names the run; peers of one run must agree
	// (optimizer.DefaultRunID).
	RunID string

	// Algo, Matchmaking, GroupSize, Tau, Period and RoundInterval
	// configure averaging (see optimizer.Config). Matchmaking defaults to
	// dht for WAGMA and ranks otherwise.
	Algo          optimizer.Algo
	Matchmaking   averaging.Matchmaking
	GroupSize     int
	Tau           int
	Period        int
	RoundInterval time.Duration
	// InnerSteps, WarmupInnerSteps, OuterLR and OuterMomentum configure
	// DiLoCo and WA-DiLoCo's outer optimization (see optimizer.Config; 0
	// takes optimizer's defaults).
	InnerSteps       int
	WarmupInnerSteps int
	OuterLR          float64
	OuterMomentum    float64
	// Fragments and OverlapSteps make DiLoCo's outer steps Streaming
	// DiLoCo's (optimizer.Config; 0: whole-model, blocking).
	Fragments, OverlapSteps int
	// Codec compresses averaging traffic; Timeout bounds one all-reduce
	// (RoundInterval with DHT matchmaking, else 20 s).
	Codec   wire.Codec
	Timeout time.Duration
	// Aggregation, MaxNormRatio and MinAgree harden averaging in open
	// swarms (see averaging.Config and optimizer.DownloadConfig): the
	// aggregation rule (mean by default), the contribution norm check (100×
	// the median by default) and how many donors of a joiner's state must
	// agree (1 by default).
	Aggregation  averaging.Aggregation
	MaxNormRatio float64
	MinAgree     int
	// MinPeers is how many peers of the run, this one included, must be
	// listed in the DHT before training starts (2); with rank
	// matchmaking the roster is the peers that answer and agree on it
	// (RosterProtocol), at least this many. WaitPeers bounds the
	// wait (1 min).
	MinPeers  int
	WaitPeers time.Duration
	// TargetBatchSize makes a swarm epoch (see optimizer.Progress).
	TargetBatchSize int64

	// Model is a model spec of package models ("mlp-small"); Seed seeds its
	// initial weights (equal on every peer) and, with the peer ID, the
	// order of its batches. An image classifier trains on Fashion-MNIST; a
	// language model ("gpt-mini", models.LanguageModeling) on Data.
	Model string
	Seed  uint64
	// Batch, LR and Momentum configure SGD with momentum for image models
	// (32, 0.05, 0.9). Language models train with AdamW: Batch sequences
	// per step at LR (the model's, models.DefaultsOf: 16 and 3e-3 for a
	// GPT) with WeightDecay, after Warmup steps of
	// linear warm-up, clipping the global norm of the (averaged) gradients
	// to ClipNorm (0: no clipping); Momentum does not apply.
	Batch       int
	LR          float64
	Momentum    float64
	WeightDecay float64
	Warmup      int
	ClipNorm    float64
	// Data is a language model's text data (train.LoadCorpus: "gcide",
	// "gcide:PATH", "text:PATH" or "tokens:PATH"; "gcide" by default).
	// Every peer trains a byte-level BPE of Vocab tokens on it (for token
	// data, Vocab is the file's vocabulary, required, and TokenWidth its
	// id size, 2 by default) and splits off a tenth for validation with
	// Seed, so peers given the same data and seed agree on both. Seq is
	// the context of a GPT size given without one (models.DefaultSeq when
	// 0); CorpusBytes bounds what is read (text.DefaultMaxBytes when 0);
	// EvalTokens bounds the validation tokens evaluated (0: all).
	Data        string
	Vocab       int
	Seq         int
	CorpusBytes int64
	TokenWidth  int
	EvalTokens  int
	// DataDir holds Fashion-MNIST ("" = Debian's location); Limit caps the
	// training examples (0 = all); Shard K of Shards gives this peer
	// every Shards-th example (Shards 0: the whole set, in its own order).
	// These are for image models only.
	DataDir      string
	Limit        int
	Shard        int
	Shards       int
	EvalExamples int // test examples per evaluation (0 = all 10000)

	// Steps, Duration: stop after this many local steps or this long
	// (0 = no limit; one of them, or ctx, must end the run).
	Steps    int
	Duration time.Duration
	// EvalEvery evaluates this peer's model on the test set this often
	// (0 = only at the end).
	EvalEvery time.Duration
	// Slowdown emulates a slower device: each step takes Slowdown times
	// its real compute time (1 = real speed). Device, if set (a child of
	// a swarm launcher), is used instead.
	Slowdown float64
	Device   *swarm.Device

	// Checkpoint is a file for model, optimizer state and round counter,
	// written atomically every CheckpointEvery and on exit, and resumed
	// from when it exists.
	Checkpoint      string
	CheckpointEvery time.Duration

	// Progress receives a progress bar (nil: none). Stats receives a JSON
	// line every StatsEvery (and a final one) with the peer's counters,
	// accuracy, memory and goroutines (nil: none).
	Progress   io.Writer
	Stats      io.Writer
	StatsEvery time.Duration
	// Log receives one-line notices (nil: none).
	Log io.Writer
	// Status, if set, runs while the peer is in the swarm, from joining
	// the DHT until it leaves (`skyhive peer` publishes the peer's status
	// record with it).
	Status StatusFunc
	// Metrics, if set, receives the Prometheus collectors of the peer's
	// DHT node, averaging optimizer and training loop (the host's come
	// from Host.Metrics). Nil: no metrics.
	Metrics prometheus.Registerer
}

// Result is the outcome of a peer's run.
type Result struct {
	Peer          string  `json:"peer"`
	Algo          string  `json:"algo"`
	TestAccuracy  float64 `json:"test_accuracy"`
	TestLoss      float64 `json:"test_loss"`
	FirstAccuracy float64 `json:"first_accuracy"` // of the first evaluation (after joining)
	Steps         int     `json:"steps"`
	Rounds        int     `json:"rounds"`
	Samples       int64   `json:"samples"`
	BytesSent     int64   `json:"bytes_sent"`
	BytesReceived int64   `json:"bytes_received"`
	Seconds       float64 `json:"seconds"`
	Joined        int     `json:"joined_from,omitempty"` // donors the state came from
	Resumed       bool    `json:"resumed,omitempty"`
	Groups        int     `json:"groups"`
	// MaxStepSeconds is the longest a Step of the averaging optimizer
	// held up training (waiting for others).
	MaxStepSeconds float64 `json:"max_step_seconds"`
	Failures       int     `json:"failures"`
	// Rejected counts contributions to this peer's parts that the
	// averager dropped (norm check or robust aggregation).
	Rejected   int `json:"rejected,omitempty"`
	Epoch      int `json:"epoch"`
	SwarmPeers int `json:"swarm_peers"`
	// Language models only: the full model spec, its vocabulary and
	// context, the training and validation tokens, the validation loss
	// and perplexity of the last evaluation and of the first, and the
	// perplexity of the add-one unigram on the same validation tokens, for
	// scale.
	Model             string  `json:"model,omitempty"`
	Vocab             int     `json:"vocab,omitempty"`
	Seq               int     `json:"seq,omitempty"`
	TrainTokens       int     `json:"train_tokens,omitempty"`
	ValTokens         int     `json:"val_tokens,omitempty"`
	EvalTokens        int     `json:"eval_tokens,omitempty"`
	ValLoss           float64 `json:"val_loss,omitempty"`
	ValPerplexity     float64 `json:"val_perplexity,omitempty"`
	FirstPerplexity   float64 `json:"first_perplexity,omitempty"`
	UnigramPerplexity float64 `json:"unigram_perplexity,omitempty"`
	// ComputeSeconds is the time this peer's emulated device was busy
	// with the steps it completed: the forward and backward passes, the
	// slowdown's sleep (Config.Slowdown) and the wrapped optimizer's local
	// update; not the waiting for, or the work of, averaging. TrainSeconds
	// is the wall time from the start of the first step to the end of the
	// last completed one, less EvalSeconds, the evaluations in between:
	// ComputeSeconds / TrainSeconds is the fraction of its training time
	// the peer computed. TrainStartUnix is when the first step started.
	ComputeSeconds float64 `json:"compute_seconds"`
	TrainSeconds   float64 `json:"train_seconds"`
	EvalSeconds    float64 `json:"eval_seconds"`
	TrainStartUnix float64 `json:"train_start_unix,omitempty"`
	// Curve lists the evaluations.
	Curve []Eval `json:"curve,omitempty"`
}

// Eval is one evaluation of the peer's model.
type Eval struct {
	Unix     float64 `json:"unix"` // wall-clock time, for comparing peers
	Seconds  float64 `json:"seconds"`
	Steps    int     `json:"steps"`
	Accuracy float64 `json:"accuracy"`
	Loss     float64 `json:"loss"`
	// Perplexity is a language model's validation perplexity, exp(Loss).
	Perplexity float64 `json:"perplexity,omitempty"`
}

// Snapshot is a line of the stats stream.
type Snapshot struct {
	Time       string             `json:"time"`
	Peer       string             `json:"peer"`
	Seconds    float64            `json:"seconds"`
	Stats      optimizer.Stats    `json:"stats"`
	Progress   optimizer.Progress `json:"progress"`
	Accuracy   float64            `json:"accuracy,omitempty"`
	Perplexity float64            `json:"perplexity,omitempty"`
	Goroutines int                `json:"goroutines"`
	RSSBytes   int64              `json:"rss_bytes"`
	HeapBytes  uint64             `json:"heap_bytes"`
	Final      *Result            `json:"final,omitempty"`
}

// Errors that name what to fix.
var (
	// ErrConfig wraps an invalid configuration.
	ErrConfig = errors.New("peer: bad configuration")
	// ErrDHT means the DHT could not be joined (it is node.ErrJoin).
	ErrDHT = node.ErrJoin
	// ErrNoSwarm means not enough peers of the run appeared.
	ErrNoSwarm = errors.New("not enough peers of the run")
)

// lm reports whether the peer trains a language model.
func (c *Config) lm() bool { return isLM(c.Model) }

// lmDefaults sets a language model's options left 0: its batch and
// learning rate (the model's, models.DefaultsOf), data, vocabulary and
// token width.
func (c *Config) lmDefaults() {
	d := models.DefaultsOf(c.Model)
	if c.Batch == 0 {
		c.Batch = cmp.Or(d.Batch, 16)
	}
	if c.LR == 0 {
		c.LR = cmp.Or(d.LR, 3e-3)
	}
	if c.Data == "" {
		c.Data = "gcide"
	}
	if c.Vocab == 0 && !strings.HasPrefix(c.Data, "tokens:") {
		c.Vocab = 1024
	}
	if c.TokenWidth == 0 {
		c.TokenWidth = 2
	}
}

func (c *Config) defaults() error {
	if c.JoinTimeout <= 0 {
		c.JoinTimeout = 30 * time.Second
	}
	if c.RunID == "" {
		c.RunID = optimizer.DefaultRunID
	}
	if c.Algo == "" {
		c.Algo = optimizer.WAGMA
	}
	if _, err := optimizer.ParseAlgo(string(c.Algo)); err != nil {
		return fmt.Errorf("%w: %v", ErrConfig, err)
	}
	if c.Matchmaking == "" {
		c.Matchmaking = averaging.MatchRanks
		if c.Algo == optimizer.WAGMA {
			c.Matchmaking = averaging.MatchDHT
		}
	}
	if c.RoundInterval <= 0 {
		c.RoundInterval = averaging.DefaultRoundInterval
	}
	if c.Timeout <= 0 {
		c.Timeout = 20 * time.Second
		if c.Matchmaking == averaging.MatchDHT {
			c.Timeout = c.RoundInterval
		}
	}
	if c.MinPeers == 0 {
		c.MinPeers = 2
	}
	if c.WaitPeers <= 0 {
		c.WaitPeers = time.Minute
	}
	if c.Model == "" {
		c.Model = "mlp-small"
	}
	lm := isLM(c.Model)
	if lm {
		c.lmDefaults()
	}
	if c.Batch == 0 {
		c.Batch = 32
	}
	if c.LR == 0 {
		c.LR = 0.05
	}
	if c.Momentum == 0 {
		c.Momentum = 0.9
	}
	if c.Slowdown == 0 {
		c.Slowdown = 1
	}
	if c.StatsEvery <= 0 {
		c.StatsEvery = 10 * time.Second
	}
	if c.CheckpointEvery <= 0 {
		c.CheckpointEvery = time.Minute
	}
	switch {
	case c.Matchmaking == averaging.MatchDHT && c.Algo != optimizer.WAGMA:
		return fmt.Errorf("%w: DHT matchmaking needs the wagma algorithm", ErrConfig)
	case c.MinPeers < 1 || c.MinPeers > averaging.MaxGroupSize:
		return fmt.Errorf("%w: min peers %d out of 1..%d", ErrConfig, c.MinPeers, averaging.MaxGroupSize)
	case c.Batch < 1 || c.LR <= 0 || math.IsInf(c.LR, 0) || c.Momentum < 0 || c.Momentum >= 1:
		return fmt.Errorf("%w: batch %d, learning rate %v, momentum %v", ErrConfig, c.Batch, c.LR, c.Momentum)
	case c.Slowdown < 1 || math.IsInf(c.Slowdown, 0):
		return fmt.Errorf("%w: slowdown %v, want at least 1", ErrConfig, c.Slowdown)
	case c.Shards < 0 || (c.Shards > 0 && (c.Shard < 0 || c.Shard >= c.Shards)):
		return fmt.Errorf("%w: shard %d of %d", ErrConfig, c.Shard, c.Shards)
	case c.Steps < 0 || c.Duration < 0:
		return fmt.Errorf("%w: negative steps or duration", ErrConfig)
	case !lm && c.Data != "" && c.Data != "fashion-mnist":
		return fmt.Errorf("%w: %s is an image classifier, which trains on Fashion-MNIST; data %q is for language models (%s)", ErrConfig, c.Model, c.Data, models.LMUsage())
	case lm && !train.IsTextData(c.Data):
		return fmt.Errorf("%w: language model %s trains on text data (%s), not %q", ErrConfig, c.Model, train.TextDataUsage, c.Data)
	case c.Warmup < 0 || c.ClipNorm < 0 || c.WeightDecay < 0 || c.Seq < 0 || c.Vocab < 0 || c.EvalTokens < 0 || c.CorpusBytes < 0:
		return fmt.Errorf("%w: warm-up, clip norm, weight decay, context, vocabulary, evaluation tokens and corpus bytes must not be negative", ErrConfig)
	case lm && (c.Shards > 0 || c.Limit != 0 || c.EvalExamples != 0):
		return fmt.Errorf("%w: shards, a limit of training examples and evaluation examples are for image models; language model %s samples from all of %s's training tokens (bound them with the corpus bytes; the evaluation with evaluation tokens)", ErrConfig, c.Model, c.Data)
	case lm && strings.HasPrefix(c.Data, "tokens:") && c.Vocab == 0:
		return fmt.Errorf("%w: data %s: give the vocabulary of the token file (--vocab; 50257 for GPT-2's tokenizer)", ErrConfig, c.Data)
	}
	return nil
}

// Run runs the peer until ctx ends, Steps are done or Duration passes,
// then evaluates its model, saves its checkpoint and leaves the swarm (its
// groups are told at once). It returns the result; ctx ending is a normal
// stop, not an error. The peer runs on a node of its own (package node),
// made from cfg's Host, Reach, DHT, DHTMaxBytes, JoinTimeout and Metrics
// (with the checkpoint's directory, which it creates), and closed when it
// returns.
func Run(ctx context.Context, cfg Config) (Result, error) {
	if err := cfg.defaults(); err != nil {
		return Result{Algo: string(cfg.Algo)}, err
	}
	if len(cfg.DHT) == 0 {
		return Result{Algo: string(cfg.Algo)}, fmt.Errorf("%w: no DHT to join: give the multiaddr of a `skyhive dht` node or of another peer (/ip4/.../tcp/.../p2p/ID)", ErrConfig)
	}
	return run(ctx, cfg, nil)
}

// RunOn runs the peer as Run does, on n, a node in DHT server mode that
// has joined the swarm's DHT; cfg's Host, Reach, DHT and DHTMaxBytes are
// not used, and n stays open.
func RunOn(ctx context.Context, n *node.Node, cfg Config) (Result, error) {
	if err := cfg.defaults(); err != nil {
		return Result{Algo: string(cfg.Algo)}, err
	}
	if n.DHT() == nil || n.Config().DHT.Mode != node.DHTServer {
		return Result{Algo: string(cfg.Algo)}, fmt.Errorf("%w: an averaging peer needs a node in DHT server mode", ErrConfig)
	}
	return run(ctx, cfg, n)
}

// nodeConfig is the configuration of a peer's own node.
func (c *Config) nodeConfig() node.Config {
	hcfg := c.Host
	hcfg.MaxMessageBytes = 64 << 20
	ncfg := node.Config{
		Host: &hcfg, ServeDialback: true, Metrics: c.Metrics, OnReach: c.Reach,
		DHT: node.DHTConfig{Mode: node.DHTServer, Bootstrap: node.BootstrapAddrs(c.DHT), JoinTimeout: c.JoinTimeout, MaxBytes: c.DHTMaxBytes},
	}
	if c.Checkpoint != "" {
		ncfg.CheckpointDir = filepath.Dir(c.Checkpoint)
	}
	return ncfg
}

// run is Run and RunOn: on n, or on a node of its own if n is nil.
func run(ctx context.Context, cfg Config, n *node.Node) (Result, error) {
	start := time.Now()
	res := Result{Algo: string(cfg.Algo)}
	su, err := newSetup(ctx, cfg)
	if err != nil {
		return res, err
	}
	model, sig := su.model, su.sig
	if lt := su.lm; lt != nil {
		lt.describe(&res)
		logf(cfg.Log, "%s on %s: %d training and %d validation tokens, vocabulary %d", lt.spec, cfg.Data, res.TrainTokens, res.ValTokens, lt.data.Vocab)
	}
	// A checkpoint of another model is refused before joining the swarm.
	ck, err := loadCheckpoint(cfg.Checkpoint, sig)
	if err != nil {
		return res, err
	}
	if n == nil {
		if n, err = openNode(ctx, cfg); err != nil {
			return res, err
		}
		defer n.Close()
	}
	h, dn := n.Host(), n.DHT()
	res.Peer = h.ID().String()
	live := &liveState{}
	defer startStatus(ctx, cfg, h, dn, live)()

	inner := &timedOptimizer{Optimizer: su.inner}
	m, err := join(ctx, cfg, n, inner, sig, ck, &res)
	if err != nil {
		return res, err
	}
	defer m.Close() // the optimizer, then the averager; n is closed above
	opt := m.Opt
	live.setOptimizer(opt)

	if err := su.task.seed(batchSeed(cfg.Seed, h.ID())); err != nil {
		return res, err
	}
	dev := cfg.Device
	if dev == nil {
		if dev, err = swarm.NewDevice("peer", cfg.Slowdown, 0); err != nil {
			return res, err
		}
	}
	t := &trainer{cfg: cfg, model: model, opt: opt, task: su.task, dev: dev, start: start, res: &res, inner: inner, live: live}
	if t.tm, err = metrics.NewTraining(cfg.Metrics); err != nil {
		return res, err
	}
	defer t.tm.Close()
	// The first and the last evaluation run to the end even when ctx
	// ends: the last one comes after the stop.
	evalCtx := context.WithoutCancel(ctx)
	if res.Joined > 0 || res.Resumed {
		if err := t.evaluate(evalCtx); err != nil { // how good the state we start from is
			return res, err
		}
	}
	if cfg.Matchmaking == averaging.MatchRanks {
		if err := startBarrier(ctx, cfg, h, m.gate, m.roster); err != nil {
			return res, err
		}
	}
	runErr := t.loop(ctx)
	// Leave the swarm first (groups in flight are told at once), then
	// evaluate and save.
	opt.Close()
	if err := t.evaluate(evalCtx); err != nil {
		runErr = errors.Join(runErr, err)
	}
	if err := t.save(); err != nil {
		runErr = errors.Join(runErr, err)
	}
	t.fill()
	t.writeStats(true)
	return res, runErr
}

// describe fills in what res says of a language model's task.
func (lt *lmTask) describe(res *Result) {
	res.Model, res.Vocab, res.Seq = lt.spec, lt.gpt.Vocab, lt.gpt.Seq
	res.TrainTokens, res.ValTokens, res.EvalTokens = len(lt.data.Train), len(lt.data.Val), len(lt.evalIDs)-1
	res.UnigramPerplexity = lt.unigram
}

// openNode starts the peer's own node; ctx ending is returned as is.
func openNode(ctx context.Context, cfg Config) (*node.Node, error) {
	n, err := node.New(ctx, cfg.nodeConfig())
	if err != nil && ctx.Err() != nil {
		return nil, ctx.Err()
	}
	return n, err
}

// startState sets the peer's starting state: its checkpoint, or the
// swarm's state if joinSwarm (the swarm has made progress), downloaded
// through d, or else the shared initial weights opt holds already.
func startState(ctx context.Context, cfg Config, opt *optimizer.Optimizer, ck *checkpoint.File, d *dht.Node, joinSwarm bool, res *Result) error {
	switch ok, err := resume(cfg.Checkpoint, ck, opt); {
	case err != nil:
		return err
	case ok:
		res.Resumed = true
		logf(cfg.Log, "resumed from %s at round %d", cfg.Checkpoint, opt.Round())
	case joinSwarm:
		dctx, cancel := context.WithTimeout(ctx, cfg.JoinTimeout)
		dl, err := opt.Join(dctx, d, optimizer.DownloadConfig{MinAgree: cfg.MinAgree})
		cancel()
		if err != nil {
			return fmt.Errorf("download the swarm's state: %w", err)
		}
		res.Joined = len(dl.From)
		reset := ""
		if dl.BuffersReset {
			reset = "; their optimizer buffers disagreed, so this peer starts with zero momentum"
		}
		logf(cfg.Log, "joined run %q at round %d with the state of %d donors (%d rejected, %d failed%s)",
			cfg.RunID, opt.Round(), len(dl.From), len(dl.Rejected), len(dl.Failed), reset)
	}
	return nil
}

// waitForPeers lists this peer under the run and waits until MinPeers
// peers of the run (this one included) training the same model are listed.
// It returns the others, and whether this peer is one of the run's
// founders: no peer of the run was training yet when it first looked (the
// founders start from the shared initial weights together, even if some
// noticed one another a poll later than others; a later peer downloads
// the swarm's state).
func waitForPeers(ctx context.Context, cfg Config, mm *averaging.Matchmaker, node *dht.Node, self libp2ppeer.ID, sig string) ([]averaging.PeerInfo, bool, error) {
	deadline := time.Now().Add(cfg.WaitPeers)
	var mismatched []averaging.PeerInfo
	founder, first := false, true
	notice := newWaitNotice(cfg.Log)
	for {
		infos := announceAndList(ctx, cfg, mm, node)
		var same []averaging.PeerInfo
		mismatched = mismatched[:0]
		for _, p := range infos {
			switch {
			case p.Addr.ID == self:
			case p.Model == sig:
				same = append(same, p)
			default:
				mismatched = append(mismatched, p)
			}
		}
		if first {
			founder, first = bestRound(same) == 0, false
		}
		if len(mismatched) > 0 && len(same) == 0 {
			return nil, false, fmt.Errorf("%w: the peers of run %q train model %q, this peer %q (every peer of a run must train the same model; check the model and the run ID)",
				optimizer.ErrModelMismatch, cfg.RunID, mismatched[0].Model, sig)
		}
		if len(same)+1 >= cfg.MinPeers {
			return same, founder, nil
		}
		notice.update(cfg.RunID, len(same)+1, cfg.MinPeers)
		if time.Now().After(deadline) {
			return nil, false, fmt.Errorf("%w: %d of %d peers of run %q appeared in the DHT within %v; check that every peer uses the same run ID, or lower the minimum of peers",
				ErrNoSwarm, len(same)+1, cfg.MinPeers, cfg.RunID, cfg.WaitPeers)
		}
		if err := clock.Sleep(ctx, min(cfg.RoundInterval, time.Second)); err != nil {
			return nil, false, err
		}
	}
}

// announceAndList lists this peer under the run (as about to start) and
// returns the run's listings, within one round interval; failures leave
// the list short, and the callers poll again.
func announceAndList(ctx context.Context, cfg Config, mm *averaging.Matchmaker, node *dht.Node) []averaging.PeerInfo {
	actx, cancel := context.WithTimeout(ctx, cfg.RoundInterval)
	defer cancel()
	_ = mm.Announce(actx, 0)
	infos, _ := averaging.FindPeers(actx, node, cfg.RunID)
	return infos
}

// roster orders the roster's peers by ID and returns them with this
// peer's rank.
func roster(peers []libp2ppeer.AddrInfo, self libp2ppeer.ID) ([]averaging.Member, int) {
	infos := slices.Clone(peers)
	slices.SortFunc(infos, func(a, b libp2ppeer.AddrInfo) int { return strings.Compare(string(a.ID), string(b.ID)) })
	ms := make([]averaging.Member, len(infos))
	rank := 0
	for i, in := range infos {
		ms[i] = averaging.Member{Peer: in, Weight: 1}
		if in.ID == self {
			rank = i
		}
	}
	return ms, rank
}

func bestRound(ps []averaging.PeerInfo) int {
	r := 0
	for _, p := range ps {
		r = max(r, p.Round)
	}
	return r
}

func idSeed(id libp2ppeer.ID) uint64 {
	var s uint64
	for _, b := range []byte(id) {
		s = s*1099511628211 + uint64(b)
	}
	return s
}

func logf(w io.Writer, format string, args ...any) {
	if w != nil {
		fmt.Fprintf(w, format+"\n", args...)
	}
}
