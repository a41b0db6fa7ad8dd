package pipeline

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/skyhive/skyhive/alloc"
	"github.com/skyhive/skyhive/data"
	"github.com/skyhive/skyhive/launch"
	"github.com/skyhive/skyhive/metrics"
	"github.com/skyhive/skyhive/netem"
	"github.com/skyhive/skyhive/node"
	"github.com/skyhive/skyhive/optim"
	"github.com/skyhive/skyhive/p2p"
	"github.com/skyhive/skyhive/train"
)

// TrainConfig configures Train: a coordinator that trains a model as a
// pipeline over local worker processes and workers that join it from
// elsewhere (`skyhive train pipeline`).
type TrainConfig struct {
	// Model is an image model of the registry or a language model (a
	// spec with or without its vocabulary and context).
	Model string
	// Data is the data set: fashion-mnist (default) or blobs for an image
	// model, text for a language model (default gcide; see
	// train.TextDataUsage).
	Data string
	// DataDir holds the Fashion-MNIST files; Limit, if positive, keeps the
	// first Limit training examples.
	DataDir string
	Limit   int
	// Text is how a language model's text is read and tokenized.
	Text TextData

	// Steps is the iterations to train (0: Epochs passes over an image
	// data set; a language model needs Steps).
	Epochs, Steps int
	// Batch, LR (the peak of a cosine decay after Warmup iterations, at
	// most a tenth of the run), WeightDecay, Clip (the global gradient-norm
	// clip) and Seed are the training's.
	Batch       int
	LR          float64
	WeightDecay float64
	Warmup      int64
	Clip        float64
	Seed        uint64
	// Checkpoint, if set, is where the stages are snapshotted every
	// CheckpointEvery iterations; Resume continues from it.
	Checkpoint      string
	Resume          bool
	CheckpointEvery int

	// Schedule and Micro (micro-batches per batch) run each iteration.
	Schedule Schedule
	Micro    int
	// Strategy plans the stages, unless Plan fixes the initial plan.
	Strategy string
	Plan     *alloc.Plan
	// Compare, if set, names strategies whose plans are measured for
	// CompareRounds iterations each before training.
	Compare       []string
	CompareRounds int
	// ReplanThreshold is the drift of a stage's speed that re-plans (0:
	// only failures); IterTimeout is how long a stage may take for an
	// iteration before it counts as failed.
	ReplanThreshold float64
	IterTimeout     time.Duration
	// LogEvery prints the per-stage table every LogEvery iterations (0:
	// only the first and those with an event).
	LogEvery int
	// KillWorker, if not negative, is the local worker the failure drill
	// kills before iteration KillAt (Scenario.FailureDrill).
	KillWorker, KillAt int

	// Scenario is the coordinator (its host, emulated network, region and
	// metrics) and the local workers to launch; Train sets its
	// coordinator's transport to the node's host. A host with no listen
	// address listens on loopback when no workers join from elsewhere.
	Scenario ScenarioConfig
	// JoinWait is the number of workers from elsewhere to wait for.
	JoinWait int
	// Node is the node the coordinator runs on: the DHT it publishes its
	// status record through, its metrics and its log (nil: Train's log).
	Node CoordinatorNode
	// Announce, if set, tells where workers reach the coordinator when it
	// waits for JoinWait of them.
	Announce func(ctx context.Context, h *p2p.Host)

	// JSON prints the result as JSON (RunResult or LMRunResult) instead of
	// a line; Stats, if set, receives one JSON line per iteration.
	JSON  bool
	Stats io.Writer
}

// TextData is how a language model's text is read and tokenized (see
// train.LoadCorpus and train.Tokenize).
type TextData struct {
	// CorpusBytes bounds the text read; TokenWidth is the bytes per id of
	// a tokens:PATH file.
	CorpusBytes int64
	TokenWidth  int
	// Vocab is the BPE vocabulary trained on text, or the vocabulary of a
	// tokens:PATH file.
	Vocab int
	// Seq is the context in tokens: the spec's when 0 and the spec gives
	// one.
	Seq int
	// EvalTokens is the validation tokens evaluated (0: all).
	EvalTokens int
}

// RunResult is what Train prints with JSON for an image model.
type RunResult struct {
	Iterations   int               `json:"iterations"`
	Ran          int               `json:"iterations_run"`
	Seconds      float64           `json:"seconds"`
	FinalLoss    float64           `json:"final_loss"`
	TestLoss     float64           `json:"test_loss"`
	TestAccuracy float64           `json:"test_accuracy"`
	Plan         alloc.Plan        `json:"plan"`
	Workers      []WorkerInfo      `json:"workers"`
	Events       []string          `json:"events,omitempty"`
	Last         *IterStats        `json:"last_iteration,omitempty"`
	Compare      []PlanMeasurement `json:"compare,omitempty"`
	Config       map[string]any    `json:"config"`
}

// LMRunResult is what Train prints with JSON for a language model.
type LMRunResult struct {
	Model         string       `json:"model"`
	Data          string       `json:"data"`
	Iterations    int          `json:"iterations"`
	Ran           int          `json:"iterations_run"`
	Seconds       float64      `json:"seconds"`
	FinalLoss     float64      `json:"final_loss"`
	FinalAccuracy float64      `json:"final_token_accuracy"`
	ValLoss       float64      `json:"val_loss"`
	ValPerplexity float64      `json:"val_perplexity"`
	ValTokens     int          `json:"val_tokens"`
	Plan          alloc.Plan   `json:"plan"`
	Workers       []WorkerInfo `json:"workers"`
	Events        []string     `json:"events,omitempty"`
	Last          *IterStats   `json:"last_iteration,omitempty"`
	// Compare holds the plans of TrainConfig.Compare as measured before
	// training.
	Compare []PlanMeasurement `json:"compare,omitempty"`
	Config  map[string]any    `json:"config"`
}

// Train runs a pipeline coordinator's role: it reads the data, starts the
// coordinator on a node of its own (publishing its status record through
// cfg.Node.DHT), launches the local workers and waits for the joining
// ones, then trains an image classifier (after measuring the plans of
// cfg.Compare) and evaluates it on the test set, or trains a language
// model and reports its validation loss and perplexity. The result goes
// to stdout, the progress and notices to log (nil: discarded).
func Train(ctx context.Context, cfg TrainConfig, stdout, log io.Writer) error {
	if stdout == nil {
		stdout = io.Discard
	}
	if log == nil {
		log = io.Discard
	}
	var trainSet, testSet *data.Dataset
	var corpus *lmText
	var err error
	if train.IsLanguageModel(cfg.Model) {
		corpus, err = loadText(cfg, log)
	} else {
		trainSet, testSet, err = imageData(cfg)
	}
	if err != nil {
		return err
	}
	r := &coordRun{cfg: cfg, live: &metrics.Live{}, stdout: stdout, log: log}
	sc, n, err := r.start(ctx)
	if err != nil {
		return err
	}
	defer n.Close()
	defer sc.Close()
	if corpus != nil {
		return r.trainLM(ctx, sc, corpus)
	}
	return r.trainImage(ctx, sc, trainSet, testSet)
}

// coordRun is one run of Train.
type coordRun struct {
	cfg         TrainConfig
	live        *metrics.Live // the iterations, for the status record
	stdout, log io.Writer
}

// start starts the coordinator's node, the coordinator on it, launches the
// local workers and waits for the joining ones. Close the scenario, then
// the node.
func (r *coordRun) start(ctx context.Context) (*Scenario, *node.Node, error) {
	cfg := r.cfg.Scenario
	if len(cfg.Coordinator.Host.ListenAddrs) == 0 && r.cfg.JoinWait == 0 {
		cfg.Coordinator.Host.ListenAddrs = []string{"/ip4/127.0.0.1/tcp/0"} // local workers only
	}
	cn := r.cfg.Node
	if cn.Log == nil {
		cn.Log = r.log
	}
	n, err := StartCoordinatorNode(ctx, cfg.Coordinator, cn)
	if err != nil {
		return nil, nil, err
	}
	cfg.Coordinator.Transport = n.Host()
	sc, err := NewScenario(ctx, cfg)
	if err != nil {
		return nil, nil, errors.Join(err, n.Close())
	}
	if err = r.launch(ctx, sc, n); err != nil {
		return nil, nil, errors.Join(err, sc.Close(), n.Close())
	}
	return sc, n, nil
}

// launch publishes the coordinator's status record on n, launches the
// local workers and waits for the joining ones.
func (r *coordRun) launch(ctx context.Context, sc *Scenario, n *node.Node) error {
	c, cfg, out := sc.Coordinator(), r.cfg.Scenario, r.log
	if r.cfg.JoinWait > 0 && r.cfg.Announce != nil {
		r.cfg.Announce(ctx, c.Host())
	}
	if err := PublishStatus(n, c, r.live); err != nil {
		return err
	}
	if len(cfg.Slowdowns) > 0 {
		fmt.Fprintf(out, "launching %d local workers, slowdowns %s\n", len(cfg.Slowdowns), fmtFloats(cfg.Slowdowns))
		if cfg.Regions != nil {
			fmt.Fprintf(out, "emulated links: workers in regions %s, coordinator in %s\n", strings.Join(cfg.Regions, ","), cfg.Coordinator.Region)
		}
	}
	if err := sc.Launch(ctx); err != nil || r.cfg.JoinWait <= 0 {
		return err
	}
	fmt.Fprintf(out, "waiting for %d workers; start them with:\n", r.cfg.JoinWait)
	for _, a := range c.Addrs() {
		fmt.Fprintf(out, "  skyhive worker --join %s\n", a)
	}
	return c.WaitWorkers(ctx, len(c.Workers())+r.cfg.JoinWait)
}

// session is the session of the run for model, trained total iterations
// with a peak learning rate lr that decays along a cosine to lr/minDiv
// after warmup iterations (at most a tenth of the run).
func (r *coordRun) session(model string, batch int, lr float64, warmup, total int64, minDiv, clip float64) SessionConfig {
	c := &r.cfg
	return SessionConfig{
		Model: model, Seed: c.Seed, Batch: batch, Micro: c.Micro, Schedule: c.Schedule,
		Optim:      OptimConfig{LR: lr, WeightDecay: c.WeightDecay},
		LRSchedule: &optim.Schedule{Peak: lr, Min: lr / minDiv, Warmup: min(warmup, total/10), Total: total, Decay: optim.Cosine},
		ClipNorm:   clip, Strategy: c.Strategy, Plan: c.Plan,
		Checkpoint: c.Checkpoint, Resume: c.Resume, CheckpointEvery: c.CheckpointEvery,
		ReplanThreshold: c.ReplanThreshold, IterTimeout: c.IterTimeout, Log: r.log,
	}
}

// onIteration records every iteration for the status record and prints
// the per-stage table of the first, every LogEvery-th and every one with
// an event.
func (r *coordRun) onIteration(batch int) func(IterStats) error {
	return func(st IterStats) error {
		RecordStatus(r.live, st, batch)
		if st.Event != "" || st.Iter == 0 || (r.cfg.LogEvery > 0 && (st.Iter+1)%r.cfg.LogEvery == 0) {
			st.WriteTable(r.log)
		}
		return nil
	}
}

// printJSON prints v as indented JSON on stdout.
func (r *coordRun) printJSON(v any) error {
	enc := json.NewEncoder(r.stdout)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// imageData loads Fashion-MNIST, or Gaussian blobs with Data blobs.
func imageData(cfg TrainConfig) (trainSet, testSet *data.Dataset, err error) {
	switch cfg.Data {
	case "blobs":
		all, err := data.GaussianBlobs(12000, InputFeatures, data.NumClasses, cfg.Seed)
		if err != nil {
			return nil, nil, err
		}
		testSet, trainSet, err = all.Split(2000, cfg.Seed)
		return trainSet, testSet, err
	case "fashion-mnist", "":
		return loadFashionMNIST(cfg.DataDir, cfg.Limit)
	}
	return nil, nil, fmt.Errorf("unknown data set %q (pipeline mode: fashion-mnist or blobs)", cfg.Data)
}

// loadFashionMNIST reads the standardized training set (its first limit
// examples if limit is positive) and test set of Fashion-MNIST from dir.
func loadFashionMNIST(dir string, limit int) (trainSet, testSet *data.Dataset, err error) {
	if trainSet, err = data.LoadFashionMNIST(dir, data.Train, data.LoadOptions{Standardize: true, Limit: limit}); err != nil {
		return nil, nil, err
	}
	testSet, err = data.LoadFashionMNIST(dir, data.Test, data.LoadOptions{Standardize: true})
	return trainSet, testSet, err
}

// TrainConfigFrom is the TrainConfig of a coordinator launched with a
// typed config (the flags of `skyhive train pipeline` or a config file):
// its model, data, training and planning options, checked (an error about
// the workers is a *launch.FieldError). FromLaunch adds the rest.
func TrainConfigFrom(c launch.Pipeline) (TrainConfig, error) {
	tc := train.Config{Model: c.Model, Epochs: c.Epochs, BatchSize: c.Batch, LR: c.LR, WeightDecay: c.WeightDecay,
		Warmup: c.Warmup, Seed: c.Seed, ClipNorm: c.Clip, Checkpoint: c.Checkpoint, Resume: c.Resume}
	if err := tc.Validate(); err != nil {
		return TrainConfig{}, err
	}
	sched, err := ParseSchedule(c.Schedule)
	if err != nil {
		return TrainConfig{}, err
	}
	if c.Workers <= 0 && c.JoinWait <= 0 {
		return TrainConfig{}, launch.NewFieldError(nil, "train pipeline needs %s N (local processes) or %s N (workers on other machines)", "workers", "join_wait")
	}
	cfg := TrainConfig{Model: c.Model, Data: c.Data, DataDir: c.DataDir, Limit: c.Limit,
		Text:   TextData{CorpusBytes: c.CorpusBytes, TokenWidth: c.TokenWidth, Vocab: c.Vocab, Seq: c.Seq, EvalTokens: c.EvalTokens},
		Epochs: c.Epochs, Steps: c.Steps, Batch: c.Batch, LR: c.LR, WeightDecay: c.WeightDecay, Warmup: c.Warmup, Clip: c.Clip, Seed: c.Seed,
		Checkpoint: c.Checkpoint, Resume: c.Resume, CheckpointEvery: c.CheckpointEvery, Schedule: sched, Micro: c.Micro, Strategy: c.Strategy,
		CompareRounds: c.CompareRounds, ReplanThreshold: c.ReplanThreshold, IterTimeout: time.Duration(c.IterTimeout), LogEvery: c.LogEvery,
		KillWorker: c.KillWorker, KillAt: c.KillAt, JoinWait: c.JoinWait, JSON: c.JSON}
	if c.Compare != "" {
		cfg.Compare = strings.Split(c.Compare, ",")
	}
	return cfg, nil
}

// Emulate makes the links between cfg's local workers (one per slowdown)
// and the coordinator those of prof: the workers in regions (nil:
// round-robin over prof's regions), the coordinator in coordRegion (""
// prof's first), the draws of the links' jitter seeded by seed.
func (cfg *ScenarioConfig) Emulate(prof *netem.Profile, regions []string, coordRegion string, seed uint64) error {
	if err := prof.Validate(); err != nil {
		return err
	}
	workers := len(cfg.Slowdowns)
	if workers == 0 {
		return errors.New("emulated links need local workers (--workers N): the proxies run in this process")
	}
	if regions == nil {
		for i := range workers {
			regions = append(regions, prof.Regions[i%len(prof.Regions)])
		}
	}
	if len(regions) != workers {
		return fmt.Errorf("%d worker regions for %d workers", len(regions), workers)
	}
	if coordRegion == "" {
		coordRegion = prof.Regions[0]
	}
	n, err := netem.New(prof, seed)
	if err != nil {
		return err
	}
	cfg.Coordinator.Network, cfg.Coordinator.Region, cfg.Regions = n, coordRegion, regions
	return nil
}
