package client

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/skyhive/skyhive/clock"
	"github.com/skyhive/skyhive/data"
	"github.com/skyhive/skyhive/moe"
	"github.com/skyhive/skyhive/nn"
	"github.com/skyhive/skyhive/optim"
	"github.com/skyhive/skyhive/p2p"
)

// ModelConfig describes a trainer's Model: its sizes, one DMoE layer per
// grid, and how those layers find and call experts.
type ModelConfig struct {
	// Inputs, Hidden and Classes are the model's sizes (see NewModel).
	Inputs, Hidden, Classes int
	// Grids are the expert grids, one per DMoE layer.
	Grids []moe.Grid
	// Layer is the template of every DMoE layer's configuration: KBest,
	// KMin, timeouts, DeadFor, AllowZeroOutputs, Codec. In, Search,
	// Transport and Seed are filled in by Build.
	Layer Config
	// CacheTTL is how long each layer's beam search caches DHT prefix
	// records.
	CacheTTL time.Duration
	// Seed seeds the local layers and the gates.
	Seed uint64
}

// Build returns a Model whose DMoE layers find experts through d (a beam
// search of width Layer.KBest per grid) and call them over tr.
func (c ModelConfig) Build(d Getter, tr p2p.Transport) (*Model, error) {
	beam := c.Layer.KBest
	if beam == 0 {
		beam = 4
	}
	var layers []Config
	for _, g := range c.Grids {
		bs, err := NewBeamSearch(d, g, beam, c.CacheTTL)
		if err != nil {
			return nil, err
		}
		l := c.Layer
		l.In, l.Search, l.Transport = c.Hidden, bs, tr
		layers = append(layers, l)
	}
	return NewModel(c.Inputs, c.Hidden, c.Classes, layers, c.Seed)
}

// TrainerConfig configures a Trainer.
type TrainerConfig struct {
	// Model configures the trainers' replicas and the master copy of the
	// local layers.
	Model ModelConfig
	// Eval configures the model that Evaluate uses. The zero value means
	// Model with AllowZeroOutputs, so that a test sample whose experts all
	// fail counts (as a likely miss) instead of failing the evaluation.
	Eval ModelConfig
	// Connect returns the transport and DHT through which a new model
	// calls experts. It is called once for the master, once per trainer
	// and once for the evaluation model, in that order: a process with
	// one host returns it every time, a simulation a new peer each time.
	Connect func(ctx context.Context) (p2p.Transport, Getter, error)
	// Trainers is the number of concurrent trainers, i.e. of batches in
	// flight (1).
	Trainers int
	// Round is the number of trainer steps whose local-layer gradients are
	// averaged into one optimizer step (1; see NewSharedRound).
	Round int
	// Optimizer configures the AdamW over the local layers; the schedule
	// given to TrainEpochs or RunFor sets its learning rate.
	Optimizer optim.AdamWConfig
	// Train is the training set, cut into batches of Batch examples
	// (the last partial batch of an epoch is dropped) shuffled with Seed.
	Train *data.Dataset
	Batch int
	Seed  uint64
	// EvalBatch and EvalParallel set Evaluate's batch size (500) and
	// batches in flight (4); EvalTimeout bounds one evaluation (0: none).
	EvalBatch, EvalParallel int
	EvalTimeout             time.Duration
	// OnStep, if set, is called after every training step with the
	// epoch (0 in RunFor) and the statistics so far of the current
	// TrainEpochs epoch or RunFor call. Calls are serialized.
	OnStep func(epoch int, s Stats)
}

// Stats counts the steps of a training run or epoch.
type Stats struct {
	// Steps counts the steps taken, failed ones included; Failed counts
	// the steps that failed (not counting those cut short by the end of
	// the run); Samples counts the examples of successful steps.
	Steps, Failed, Samples int64
	// LossSum is the sum of the successful steps' losses.
	LossSum float64
	// Err is the first failure.
	Err error
	// Elapsed is the wall-clock time of the run or epoch, once it ended.
	Elapsed time.Duration
}

// MeanLoss is the mean loss of the successful steps.
func (s Stats) MeanLoss() float64 { return s.LossSum / float64(max(s.Steps-s.Failed, 1)) }

// Trainer runs several asynchronous DMoE trainers in one process, as
// Learning@home's trainers do on many machines: each trainer steps its own
// replica of the Model (StepDeferred) and hands the result to a Shared
// master copy of the local layers, which takes the optimizer steps. The
// experts are trained by their servers from the trainers' backward calls.
//
// TrainEpochs feeds all trainers from one shuffled stream, epoch after
// epoch, with a learning rate that follows the optimizer steps; RunFor
// gives each trainer its own shard of the data for a wall-clock budget,
// with a learning rate that follows the time. Evaluate measures a snapshot
// of the master. A Trainer runs one of them at a time.
type Trainer struct {
	cfg      TrainerConfig
	shared   *Shared
	replicas []*Model
	eval     *Model
	loader   *data.Loader

	mu    sync.Mutex
	stats Stats
}

// NewTrainer builds the master, the replicas and the evaluation model,
// connecting each through cfg.Connect.
func NewTrainer(ctx context.Context, cfg TrainerConfig) (*Trainer, error) {
	if cfg.Connect == nil {
		return nil, errors.New("moe/client: trainer needs Connect")
	}
	cfg.Trainers = max(cfg.Trainers, 1)
	cfg.Round = max(cfg.Round, 1)
	if cfg.EvalBatch <= 0 {
		cfg.EvalBatch = 500
	}
	if cfg.EvalParallel <= 0 {
		cfg.EvalParallel = 4
	}
	if cfg.Eval.Hidden == 0 {
		cfg.Eval = cfg.Model
		cfg.Eval.Layer.AllowZeroOutputs = true
	}
	t := &Trainer{cfg: cfg}
	if cfg.Train != nil {
		l, err := data.NewLoader(cfg.Train, data.BatchOptions{Size: cfg.Batch, Shuffle: true, Seed: cfg.Seed, DropLast: true})
		if err != nil {
			return nil, fmt.Errorf("moe/client: trainer: %w", err)
		}
		t.loader = l
	}
	build := func(mc ModelConfig) (*Model, error) {
		tr, d, err := cfg.Connect(ctx)
		if err != nil {
			return nil, fmt.Errorf("moe/client: trainer: connect: %w", err)
		}
		return mc.Build(d, tr)
	}
	master, err := build(cfg.Model)
	if err != nil {
		return nil, err
	}
	t.shared = NewSharedRound(master, optim.NewAdamW(master.Params(), cfg.Optimizer), cfg.Round)
	for range cfg.Trainers {
		m, err := build(cfg.Model)
		if err != nil {
			return nil, err
		}
		t.replicas = append(t.replicas, m)
	}
	if t.eval, err = build(cfg.Eval); err != nil {
		return nil, err
	}
	return t, nil
}

// Shared returns the master copy of the local layers.
func (t *Trainer) Shared() *Shared { return t.shared }

// EpochLen is the number of steps in one epoch of TrainEpochs.
func (t *Trainer) EpochLen() int {
	if t.loader == nil {
		return 0
	}
	return t.loader.Len()
}

// Stats returns the statistics of the current or last epoch or run.
func (t *Trainer) Stats() Stats {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.stats
}

// step runs one trainer step on replica m and, if it succeeded, applies it
// to the master. setLR, if set, is called just before.
func (t *Trainer) step(ctx context.Context, epoch int, m *Model, b data.Batch, setLR func()) {
	nn.ZeroGrad(m.Params())
	d, loss, _, err := m.StepDeferred(ctx, b.X, b.Y)
	t.mu.Lock()
	t.stats.Steps++
	switch {
	case err == nil:
		t.stats.Samples += int64(b.Len())
		t.stats.LossSum += float64(loss)
	case ctx.Err() == nil:
		t.stats.Failed++
		if t.stats.Err == nil {
			t.stats.Err = err
		}
	}
	if t.cfg.OnStep != nil {
		t.cfg.OnStep(epoch, t.stats)
	}
	t.mu.Unlock()
	if err != nil {
		return
	}
	if setLR != nil {
		setLR()
	}
	t.shared.Apply(m, d)
}

func (t *Trainer) reset() time.Time {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.stats = Stats{}
	return time.Now()
}

func (t *Trainer) finish(start time.Time) Stats {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.stats.Elapsed = time.Since(start)
	return t.stats
}

// EpochOptions are the arguments of TrainEpochs.
type EpochOptions struct {
	// Epochs is the number of passes over the training set.
	Epochs int
	// MaxSteps stops training after this many steps in total (0: none).
	MaxSteps int64
	// LR is the learning rate as a function of the number of optimizer
	// steps taken.
	LR optim.Schedule
	// OnEpoch, if set, is called after every epoch with its statistics,
	// e.g. to evaluate; an error stops training and is returned.
	OnEpoch func(ctx context.Context, epoch int, s Stats) error
}

// TrainEpochs trains for o.Epochs epochs or o.MaxSteps steps. In each
// epoch the trainers take the batches of one shuffled pass over the
// training set, one at a time, as they become free. It fails when every
// step of an epoch failed (Stats then has the epoch's counts), and stops
// with ctx's error.
func (t *Trainer) TrainEpochs(ctx context.Context, o EpochOptions) error {
	if t.loader == nil {
		return errors.New("moe/client: trainer has no training set")
	}
	setLR := func() { t.shared.SetLR(o.LR.LR(t.shared.Steps())) }
	var total int64
	for epoch := range o.Epochs {
		start := t.reset()
		batches := make(chan data.Batch)
		var wg sync.WaitGroup
		for _, m := range t.replicas {
			wg.Go(func() {
				for b := range batches {
					t.step(ctx, epoch, m, b, setLR)
				}
			})
		}
	feed:
		for _, b := range t.loader.Epoch(epoch) {
			if o.MaxSteps > 0 && total >= o.MaxSteps {
				break
			}
			select {
			case batches <- b:
				total++
			case <-ctx.Done():
				break feed
			}
		}
		close(batches)
		wg.Wait()
		s := t.finish(start)
		if err := ctx.Err(); err != nil {
			return err
		}
		if s.Failed == s.Steps && s.Steps > 0 {
			return fmt.Errorf("moe/client: all %d steps of epoch %d failed: %w", s.Steps, epoch+1, s.Err)
		}
		if o.OnEpoch != nil {
			if err := o.OnEpoch(ctx, epoch, s); err != nil {
				return err
			}
		}
		if o.MaxSteps > 0 && total >= o.MaxSteps {
			break
		}
	}
	return nil
}

// RunOptions are the arguments of RunFor.
type RunOptions struct {
	// Budget is the wall-clock time to train.
	Budget time.Duration
	// LR is the learning rate as a function of the milliseconds since the
	// start (Total is usually Budget in milliseconds); it is updated every
	// 100 ms.
	LR optim.Schedule
	// Stagger delays each trainer's start by a random time in [0, Stagger)
	// (seeded by the configuration's Seed and the trainer's index) so
	// that the trainers do not move in lockstep.
	Stagger time.Duration
	// Every and OnTick, if set, call OnTick every Every while the
	// trainers run (e.g. to evaluate a snapshot), with the time since the
	// start and the statistics so far. Training goes on during the call.
	Every  time.Duration
	OnTick func(elapsed time.Duration, s Stats)
}

// RunFor trains for o.Budget: trainer i loops over shard i of the
// training set (shuffled with Seed+i) until the budget is spent. Steps
// under way at the end are cut short and not counted as failures. It
// returns the run's statistics, and ctx's error if ctx ended first.
func (t *Trainer) RunFor(ctx context.Context, o RunOptions) (Stats, error) {
	if t.cfg.Train == nil {
		return Stats{}, errors.New("moe/client: trainer has no training set")
	}
	n := len(t.replicas)
	loaders := make([]*data.Loader, n)
	for i := range loaders {
		shard, err := t.cfg.Train.Shard(i, n)
		if err != nil {
			return Stats{}, fmt.Errorf("moe/client: trainer %d: %w", i, err)
		}
		loaders[i], err = data.NewLoader(shard, data.BatchOptions{Size: t.cfg.Batch, Shuffle: true, Seed: t.cfg.Seed + uint64(i), DropLast: true})
		if err != nil {
			return Stats{}, fmt.Errorf("moe/client: trainer %d: %w", i, err)
		}
		if loaders[i].Len() == 0 {
			return Stats{}, fmt.Errorf("moe/client: trainer %d: shard of %d examples holds no batch of %d", i, shard.Len(), t.cfg.Batch)
		}
	}
	start := t.reset()
	tctx, cancel := context.WithTimeout(ctx, o.Budget)
	defer cancel()
	lrAt := func() float64 { return o.LR.LR(time.Since(start).Milliseconds()) }
	t.shared.SetLR(lrAt())
	var wg sync.WaitGroup
	for i, m := range t.replicas {
		wg.Go(func() {
			if o.Stagger > 0 {
				rng := rand.New(rand.NewPCG(t.cfg.Seed, uint64(i)))
				if clock.Sleep(tctx, time.Duration(rng.Int64N(int64(o.Stagger)))) != nil {
					return
				}
			}
			for epoch := 0; tctx.Err() == nil; epoch++ {
				for _, b := range loaders[i].Epoch(epoch) {
					if tctx.Err() != nil {
						return
					}
					t.step(tctx, 0, m, b, nil)
				}
			}
		})
	}
	wg.Go(func() {
		tk := time.NewTicker(100 * time.Millisecond)
		defer tk.Stop()
		for {
			select {
			case <-tctx.Done():
				return
			case <-tk.C:
				t.shared.SetLR(lrAt())
			}
		}
	})
	if o.Every > 0 && o.OnTick != nil {
		tk := time.NewTicker(o.Every)
	loop:
		for {
			select {
			case <-tctx.Done():
				break loop
			case <-tk.C:
				o.OnTick(time.Since(start), t.Stats())
			}
		}
		tk.Stop()
	}
	wg.Wait()
	s := t.finish(start)
	return s, ctx.Err()
}

// Evaluate copies the master's weights into the evaluation model and
// returns its mean loss and accuracy on ds. Training may go on meanwhile.
func (t *Trainer) Evaluate(ctx context.Context, ds *data.Dataset) (loss, acc float64, err error) {
	t.shared.Sync(t.eval)
	if t.cfg.EvalTimeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, t.cfg.EvalTimeout)
		defer cancel()
	}
	loss, acc, err = t.eval.Evaluate(ctx, ds, t.cfg.EvalBatch, t.cfg.EvalParallel)
	if err != nil {
		return loss, acc, fmt.Errorf("moe/client: evaluate: %w", err)
	}
	return loss, acc, nil
}
