package pipeline

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sync"
	"time"

	"github.com/skyhive/skyhive/data"
	"github.com/skyhive/skyhive/tensor"
	"github.com/skyhive/skyhive/text"
	"github.com/skyhive/skyhive/wire"
)

// Step trains an image classifier on one batch. If a worker fails or
// times out it re-plans on the remaining workers (restoring lost layers
// from the checkpoint) and retries the batch, up to MaxRecoveries times.
// A language model trains with StepTokens.
func (s *Session) Step(ctx context.Context, b data.Batch) (IterStats, error) {
	if s.info.lm() {
		return IterStats{}, fmt.Errorf("pipeline: %s is a language model: train it with StepTokens", s.cfg.Model)
	}
	if b.Len() < s.cfg.Schedule.Micro(s.cfg.Micro) || b.Len() > maxBatch || b.X == nil || b.X.Len() != b.Len()*InputFeatures {
		return IterStats{}, fmt.Errorf("pipeline: batch of %d examples does not fit the session", b.Len())
	}
	if b.Len() > s.cfg.Batch {
		// Stages accept at most a batch of activations per iteration.
		return IterStats{}, fmt.Errorf("pipeline: batch of %d examples, over the session's batch size %d", b.Len(), s.cfg.Batch)
	}
	n := b.Len()
	y := tensor.New(n)
	for i, v := range b.Y {
		y.Data[i] = float32(v)
	}
	return s.step(ctx, tensor.FromSlice(b.X.Data, n, InputFeatures), y, n)
}

// StepTokens trains a language model on one batch of text (text.Batch:
// [n, Seq] token ids and their [n, Seq] next tokens), recovering from
// failures as Step does. Every sequence must be the model's context
// length, and every id and label an integer in [0, Vocab): a batch that
// is not is refused before anything is sent. IterStats.Loss is the mean
// cross-entropy per token and Accuracy the fraction of next tokens
// predicted (argmax).
func (s *Session) StepTokens(ctx context.Context, b text.Batch) (IterStats, error) {
	if !s.info.lm() {
		return IterStats{}, fmt.Errorf("pipeline: %s is not a language model: train it with Step", s.cfg.Model)
	}
	if b.X == nil || b.Y == nil || len(b.X.Shape) != 2 {
		return IterStats{}, errors.New("pipeline: a text batch needs [n, seq] token ids X and labels Y")
	}
	n := b.X.Shape[0]
	if n < s.cfg.Schedule.Micro(s.cfg.Micro) || n > maxBatch {
		return IterStats{}, fmt.Errorf("pipeline: batch of %d sequences does not fit the session", n)
	}
	if n > s.cfg.Batch {
		return IterStats{}, fmt.Errorf("pipeline: batch of %d sequences, over the session's batch size %d", n, s.cfg.Batch)
	}
	if err := s.info.checkTokens(b.X, b.Y, n); err != nil {
		return IterStats{}, fmt.Errorf("%w (model %s)", err, s.cfg.Model)
	}
	return s.step(ctx, b.X, b.Y, n)
}

// step runs an iteration on n examples of inputs x and labels y, as the
// stages take them, recovering from failures.
func (s *Session) step(ctx context.Context, x, y *tensor.Tensor, n int) (IterStats, error) {
	var event string
	for attempt := 0; ; attempt++ {
		st, committed, err := s.tryIter(ctx, x, y, n)
		if committed {
			s.iter++
		}
		if err == nil {
			st.Event = event
			if s.c.m != nil {
				s.c.m.iteration(st, n)
			}
			if s.iter%s.cfg.CheckpointEvery == 0 {
				if err := s.checkpoint(ctx); err != nil {
					fmt.Fprintf(s.cfg.Log, "checkpoint failed: %v\n", err)
				}
			}
			if reason := s.drifted(st); reason != "" {
				changed, err := s.replan(ctx, reason, false)
				if err != nil {
					return st, err
				}
				if changed {
					st.Event = joinEvent(st.Event, "re-planned: "+reason)
				}
			}
			return st, nil
		}
		if ctx.Err() != nil {
			return st, ctx.Err()
		}
		if attempt >= s.cfg.MaxRecoveries {
			return st, fmt.Errorf("pipeline: iteration %d failed after %d re-plans: %w", s.iter, attempt, err)
		}
		if rerr := s.recover(ctx, err); rerr != nil {
			return st, rerr
		}
		event = joinEvent(event, fmt.Sprintf("re-planned after failure: %v", err))
		if committed {
			return st, nil // the batch was learned; the failure hit the commit
		}
	}
}

func joinEvent(a, b string) string {
	if a == "" {
		return b
	}
	return a + "; " + b
}

// tryIter runs one iteration on the current plan and commits it.
func (s *Session) tryIter(ctx context.Context, x, y *tensor.Tensor, n int) (IterStats, bool, error) {
	sizes := s.microSizes(n)
	labels := n * s.info.Labels
	start := time.Now()
	ictx, cancel := context.WithTimeoutCause(ctx, s.cfg.IterTimeout+5*time.Second, errors.New("iteration timed out"))
	defer cancel()
	S := len(s.stages)
	resps := make([]iterResp, S)
	var mu sync.Mutex
	var firstErr error
	var wg sync.WaitGroup
	for k, a := range s.stages {
		wg.Go(func() {
			req := iterReq{Gen: s.gen, Iter: s.iter, Schedule: s.cfg.Schedule, Sizes: sizes, TimeoutMS: s.cfg.IterTimeout.Milliseconds()}
			var ts []wire.Named
			if k == 0 {
				ts = append(ts, wire.Named{Name: "x", Tensor: x})
			}
			if k == S-1 {
				ts = append(ts, wire.Named{Name: "y", Tensor: y})
			}
			_, err := s.c.call(ictx, a.worker, ProtoIter, req, ts, &resps[k], wire.Limits{})
			if err != nil {
				mu.Lock()
				if firstErr == nil {
					firstErr = &stageError{worker: a.worker, err: fmt.Errorf("stage %d (%s): %w", k, s.c.worker(a.worker).Name, err)}
					cancel()
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	if firstErr != nil {
		return IterStats{}, false, firstErr
	}
	var sq float64
	for k, r := range resps {
		// A stage's report feeds the clipping scale and the statistics:
		// an impossible one fails the iteration like the stage failed.
		if r.GradSq < 0 || math.IsInf(r.GradSq, 0) || math.IsInf(r.Loss, 0) || r.Correct < 0 || r.Correct > labels {
			return IterStats{}, false, &stageError{worker: s.stages[k].worker, err: fmt.Errorf("stage %d (%s): impossible report %+v", k, s.c.worker(s.stages[k].worker).Name, r)}
		}
		sq += r.GradSq
	}
	loss := resps[S-1].Loss
	if math.IsNaN(loss) || math.IsNaN(sq) {
		return IterStats{}, false, fmt.Errorf("pipeline: iteration %d: loss or gradient is NaN", s.iter)
	}
	scale := 1.0
	if norm := math.Sqrt(sq); s.cfg.ClipNorm > 0 && norm > s.cfg.ClipNorm {
		scale = s.cfg.ClipNorm / norm
	}
	lr := s.cfg.Optim.LR
	if s.cfg.LRSchedule != nil {
		lr = s.cfg.LRSchedule.LR(int64(s.iter))
	}
	commits := make([]commitResp, S)
	cerrs := make([]error, S)
	for k, a := range s.stages {
		wg.Go(func() {
			cctx, cancel := context.WithTimeout(ctx, s.cfg.IterTimeout)
			defer cancel()
			_, cerrs[k] = s.c.call(cctx, a.worker, ProtoCommit, commitReq{Gen: s.gen, Iter: s.iter, LR: lr, Scale: scale}, nil, &commits[k], wire.Limits{})
		})
	}
	wg.Wait()
	st := IterStats{Iter: s.iter, Gen: s.gen, Loss: loss, Accuracy: float64(resps[S-1].Correct) / float64(labels), Seconds: time.Since(start).Seconds()}
	for k, a := range s.stages {
		r := resps[k]
		t := StageTiming{
			Stage: k, Worker: s.c.worker(a.worker).Name, First: a.first, Last: a.last,
			Compute: r.Compute + commits[k].Seconds, Comm: r.Comm, Idle: r.Idle, Wall: r.Wall + commits[k].Seconds, CPU: r.CPU, OpCV: r.OpCV,
			Step: commits[k].Seconds,
		}
		if r.Compute > 0 {
			t.Speed = s.stageFLOPs(a) / r.Compute
		}
		st.Stages = append(st.Stages, t)
	}
	for k, err := range cerrs {
		if err != nil {
			return st, true, &stageError{worker: s.stages[k].worker, err: fmt.Errorf("commit on stage %d: %w", k, err)}
		}
	}
	return st, true, nil
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}

// stageFLOPs is the forward+backward work of a stage for one batch.
func (s *Session) stageFLOPs(a assignment) float64 {
	f := 0.0
	for _, l := range s.amodel.Layers[a.first:a.last] {
		f += l.FwdFLOPs + l.BwdFLOPs
	}
	return f
}

// drifted feeds the iteration's measured stage speeds to the drift
// detector and reports why the plan should be redone, or "". On drift,
// every worker's planning speed is scaled by its stage's change.
func (s *Session) drifted(st IterStats) string {
	speeds := make([]float64, len(st.Stages))
	for k, t := range st.Stages {
		speeds[k] = t.Speed
	}
	d, ok := s.drift.observe(speeds)
	if !ok {
		return ""
	}
	for k, a := range s.stages {
		if d.speeds[k] > 0 {
			s.c.setSpeed(a.worker, d.speeds[k])
		}
	}
	return fmt.Sprintf("stage %d (%s) runs at %.0f%% of its speed at planning", d.stage, st.Stages[d.stage].Worker, 100*d.ratio)
}
