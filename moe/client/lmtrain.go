package client

import (
	"context"
	"errors"
	"fmt"
	"math"

	"github.com/skyhive/skyhive/nn"
	"github.com/skyhive/skyhive/optim"
	"github.com/skyhive/skyhive/tensor"
	"github.com/skyhive/skyhive/text"
)

// Evaluate returns the mean next-token cross entropy (nats per token) of
// the model on tokens, cut into consecutive windows of seq tokens
// (text.Windows) evaluated batch windows at a time; exp of it is the
// perplexity. Every token of a window but the first is predicted once from
// the tokens before it in its window.
func (m *LM) Evaluate(ctx context.Context, tokens []int32, seq, batch int) (float64, error) {
	if seq > m.cfg.Seq {
		return 0, fmt.Errorf("moe/client: evaluation windows of %d tokens exceed the model's %d", seq, m.cfg.Seq)
	}
	windows, err := text.Windows(tokens, batch, seq)
	if err != nil {
		return 0, fmt.Errorf("moe/client: evaluate: %w", err)
	}
	var sum float64
	var n int
	for b := range windows {
		loss, err := m.Loss(ctx, b.X, b.Labels())
		if err != nil {
			return 0, fmt.Errorf("moe/client: evaluate: %w", err)
		}
		k := b.Y.Len()
		sum += float64(loss) * float64(k)
		n += k
	}
	return sum / float64(n), nil
}

// LMTrainConfig configures TrainLM.
type LMTrainConfig struct {
	// Steps is the number of training steps (required).
	Steps int64
	// LR is the schedule of the local layers' learning rate; its Total is
	// set to Steps when 0.
	LR optim.Schedule
	// ClipNorm clips the global norm of the local gradients (0: never).
	ClipNorm float64
	// MaxFailures is how many consecutive failed steps (a DMoE layer
	// without answers, a failed backward call) end the run (10).
	MaxFailures int
	// OnStep, if set, is called after every step with its number (from
	// 0), its loss (NaN for a failed step) and its error.
	OnStep func(step int64, loss float64, err error)
}

// LMTrainStats summarises a TrainLM run.
type LMTrainStats struct {
	// Steps counts the steps taken, Failed those that failed.
	Steps, Failed int64
	// LastLoss is the mean loss of the last tenth of the successful steps.
	LastLoss float64
	// Err is the first failure.
	Err error
}

// TrainLM trains m's local layers with opt (built over m.Params()) on
// batches from sampler, one step at a time, while the expert servers train
// the experts from the backward calls. A failed step (no expert answered
// a position, or a backward call failed) is skipped and counted; the run
// ends with an error after MaxFailures failures in a row or when ctx ends.
func TrainLM(ctx context.Context, m *LM, opt optim.Optimizer, sampler *text.Sampler, cfg LMTrainConfig) (LMTrainStats, error) {
	var st LMTrainStats
	if cfg.Steps < 1 {
		return st, errors.New("moe/client: TrainLM needs Steps")
	}
	if cfg.MaxFailures <= 0 {
		cfg.MaxFailures = 10
	}
	if cfg.LR.Total == 0 {
		cfg.LR.Total = cfg.Steps
	}
	params := m.Params()
	tail := max(cfg.Steps/10, 1)
	var tailSum float64
	var tailN int64
	row := 0
	for step := range cfg.Steps {
		if err := ctx.Err(); err != nil {
			return st, err
		}
		b := sampler.Next()
		nn.ZeroGrad(params)
		loss, err := m.Step(ctx, b.X, b.Labels())
		st.Steps++
		if err == nil && !finite(params) {
			err = errors.New("moe/client: non-finite local gradient")
		}
		if err != nil {
			st.Failed++
			if st.Err == nil {
				st.Err = err
			}
			row++
			if cfg.OnStep != nil {
				cfg.OnStep(step, math.NaN(), err)
			}
			if ctx.Err() != nil {
				return st, ctx.Err()
			}
			if row >= cfg.MaxFailures {
				return st, fmt.Errorf("moe/client: %d steps failed in a row: %w", row, err)
			}
			continue
		}
		row = 0
		if cfg.ClipNorm > 0 {
			optim.ClipGradNorm(params, cfg.ClipNorm)
		}
		opt.SetLR(cfg.LR.LR(step))
		opt.Step()
		if step >= cfg.Steps-tail {
			tailSum += float64(loss)
			tailN++
		}
		if cfg.OnStep != nil {
			cfg.OnStep(step, float64(loss), nil)
		}
	}
	if tailN > 0 {
		st.LastLoss = tailSum / float64(tailN)
	}
	return st, nil
}

func finite(ps []*nn.Param) bool {
	for _, p := range ps {
		s := tensor.SumSquares(p.Grad.Data)
		if math.IsNaN(s) || math.IsInf(s, 0) {
			return false
		}
	}
	return true
}
