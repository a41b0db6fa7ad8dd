package pipeline

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/skyhive/skyhive/data"
	"github.com/skyhive/skyhive/nn"
	"github.com/skyhive/skyhive/text"
	"github.com/skyhive/skyhive/train"
)

// Batches yields a loader's batches epoch after epoch, without end.
type Batches struct {
	l     *data.Loader
	epoch int
	buf   []data.Batch
}

// NewBatches starts at the first batch of epoch 0 of l.
func NewBatches(l *data.Loader) *Batches { return &Batches{l: l} }

// Next returns the next batch, and whether it is the last of its epoch.
// It panics if the loader yields no batch.
func (b *Batches) Next() (batch data.Batch, epochEnd bool) {
	if len(b.buf) == 0 {
		for _, x := range b.l.Epoch(b.epoch) {
			b.buf = append(b.buf, x)
		}
		if len(b.buf) == 0 {
			panic("pipeline: a loader without batches")
		}
	}
	batch, b.buf = b.buf[0], b.buf[1:]
	if len(b.buf) == 0 {
		b.epoch++
		return batch, true
	}
	return batch, false
}

// Epoch is the epoch of the next batch.
func (b *Batches) Epoch() int { return b.epoch }

// TrainOptions configures Session.Train. The session itself checkpoints
// (SessionConfig.CheckpointEvery), re-plans and recovers from failures.
type TrainOptions struct {
	// Data yields the training batches of an image classifier (of the
	// session's batch size); Tokens those of a language model. Give one.
	Data   *Batches
	Tokens *text.Sampler
	// Steps is the iteration, counted by the session (Session.Iter, which
	// includes resumed ones), at which training stops. When 0, Epochs
	// epochs of Data's loader are the total.
	Steps int
	// Epochs is the number of passes over the data when Steps is 0.
	Epochs int
	// BeforeStep, when set, is called before every iteration with the
	// session's iteration number; an error stops training.
	BeforeStep func(ctx context.Context, iter int) error
	// OnIteration, when set, is called after every iteration; an error
	// stops training.
	OnIteration func(IterStats) error
	// OnEpoch, when set, is called after the last batch of every epoch
	// with the epoch's number and its mean loss; an error stops training.
	OnEpoch func(epoch int, meanLoss float64) error
	// Stats, when set, receives every iteration's IterStats as a JSON line.
	Stats io.Writer
	// Eval, when set, is the test set on which the final parameters are
	// evaluated, EvalBatch examples at a time (default 512). EvalTokens,
	// when set, are a language model's validation tokens, evaluated
	// EvalBatch windows at a time (default 16; EvaluateTokens).
	Eval       *data.Dataset
	EvalTokens []int32
	EvalBatch  int
}

// TrainResult summarises a Train run.
type TrainResult struct {
	// Iterations is the session's iteration count at the end; Ran is how
	// many of them this call ran (fewer after a resume from a checkpoint).
	Iterations, Ran int
	// Duration is the wall time of the iterations run.
	Duration time.Duration
	// Last is the last iteration's stats (zero if none ran).
	Last IterStats
	// Events lists the iterations with a re-plan or recovery, as
	// "iteration N: EVENT".
	Events []string
	// TestLoss and TestAccuracy are the evaluation on TrainOptions.Eval;
	// for a language model TestLoss is the mean cross-entropy per token on
	// TrainOptions.EvalTokens, and TestAccuracy 0.
	TestLoss, TestAccuracy float64
}

// Train runs iterations until the session reaches the step count, calling
// the options' hooks, and evaluates the final parameters on the test set
// or the validation tokens.
func (s *Session) Train(ctx context.Context, o TrainOptions) (TrainResult, error) {
	var res TrainResult
	if (o.Data == nil) == (o.Tokens == nil) {
		return res, errors.New("pipeline: train: give either batches or tokens")
	}
	total := o.Steps
	if total <= 0 {
		if o.Epochs <= 0 || o.Data == nil {
			return res, fmt.Errorf("pipeline: train: need a positive step or epoch count, got %d steps and %d epochs", o.Steps, o.Epochs)
		}
		total = o.Data.l.Len() * o.Epochs
	}
	var enc *json.Encoder
	if o.Stats != nil {
		enc = json.NewEncoder(o.Stats)
	}
	start := time.Now()
	var lossSum float64
	var lossN int
	for s.Iter() < total {
		if o.BeforeStep != nil {
			if err := o.BeforeStep(ctx, s.Iter()); err != nil {
				return res, err
			}
		}
		st, epoch, epochEnd, err := s.trainStep(ctx, o)
		if err != nil {
			return res, err
		}
		res.Last = st
		res.Ran++
		lossSum += st.Loss
		lossN++
		if enc != nil {
			if err := enc.Encode(st); err != nil {
				return res, fmt.Errorf("pipeline: train: writing stats: %w", err)
			}
		}
		if st.Event != "" {
			res.Events = append(res.Events, fmt.Sprintf("iteration %d: %s", st.Iter, st.Event))
		}
		if o.OnIteration != nil {
			if err := o.OnIteration(st); err != nil {
				return res, err
			}
		}
		if epochEnd {
			if o.OnEpoch != nil {
				if err := o.OnEpoch(epoch, lossSum/float64(lossN)); err != nil {
					return res, err
				}
			}
			lossSum, lossN = 0, 0
		}
	}
	res.Duration = time.Since(start)
	res.Iterations = s.Iter()
	var err error
	switch {
	case o.Eval != nil:
		res.TestLoss, res.TestAccuracy, err = s.Evaluate(ctx, o.Eval, o.EvalBatch)
	case o.EvalTokens != nil:
		res.TestLoss, err = s.EvaluateTokens(ctx, o.EvalTokens, o.EvalBatch)
	}
	return res, err
}

// trainStep runs Train's next iteration on the next batch of o.Data, with
// its epoch and whether it ended the epoch, or of o.Tokens (epoch 0).
func (s *Session) trainStep(ctx context.Context, o TrainOptions) (st IterStats, epoch int, epochEnd bool, err error) {
	if o.Tokens != nil {
		st, err = s.StepTokens(ctx, o.Tokens.Next())
		return st, 0, false, err
	}
	epoch = o.Data.Epoch()
	b, epochEnd := o.Data.Next()
	st, err = s.Step(ctx, b)
	return st, epoch, epochEnd, err
}

// Evaluate gathers the session's parameters into one model and returns its
// mean loss and accuracy on ds, batch examples at a time (default 512).
// A language model is evaluated with EvaluateTokens.
func (s *Session) Evaluate(ctx context.Context, ds *data.Dataset, batch int) (loss, acc float64, err error) {
	if s.info.lm() {
		return 0, 0, fmt.Errorf("pipeline: %s is a language model: evaluate it with EvaluateTokens", s.cfg.Model)
	}
	if batch <= 0 {
		batch = 512
	}
	model, err := s.Gather(ctx)
	if err != nil {
		return 0, 0, err
	}
	loss, acc = train.Evaluate(model, ds, batch)
	return loss, acc, nil
}

// Gather fetches the session's parameters from the stages into one model
// (BuildModel of the session's spec): for evaluation, generation or
// export.
func (s *Session) Gather(ctx context.Context) (*nn.Sequential, error) {
	snap, err := s.Snapshot(ctx)
	if err != nil {
		return nil, err
	}
	model, err := BuildModel(s.cfg.Model, s.cfg.Seed)
	if err != nil {
		return nil, err
	}
	if err := nn.ImportParams(model.Params(), snap.Params); err != nil {
		return nil, fmt.Errorf("pipeline: gathering the model: %w", err)
	}
	return model, nil
}

// EvaluateTokens gathers a language model's parameters into one model and
// returns its mean cross-entropy per token (nats; perplexity is its exp)
// on tokens, cut into consecutive windows of the model's context length,
// batch windows at a time (default 16), as train.EvaluateLM does.
func (s *Session) EvaluateTokens(ctx context.Context, tokens []int32, batch int) (float64, error) {
	if !s.info.lm() {
		return 0, fmt.Errorf("pipeline: %s is not a language model: evaluate it with Evaluate", s.cfg.Model)
	}
	if batch <= 0 {
		batch = 16
	}
	for i, t := range tokens {
		if t < 0 || int(t) >= s.info.Classes {
			return 0, fmt.Errorf("pipeline: evaluation token %d at %d is not in [0, %d)", t, i, s.info.Classes)
		}
	}
	model, err := s.Gather(ctx)
	if err != nil {
		return 0, err
	}
	loss, err := train.EvaluateLM(ctx, model, tokens, s.info.GPT.Seq, batch)
	if err != nil {
		return 0, fmt.Errorf("pipeline: evaluate: %w", err)
	}
	return loss, nil
}
