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
	"github.com/skyhive/skyhive/wire"
)

// Step trains on one batch. If a worker fails or times out it re-plans on
// the remaining workers (restoring lost layers from the checkpoint) and
// retries the batch, up to MaxRecoveries times.
func (s *Session) Step(ctx context.Context, b data.Batch) (IterStats, error) {
	if b.Len() < s.cfg.Schedule.Micro(s.cfg.Micro) || b.Len() > maxBatch || b.X == nil || b.X.Len() != b.Len()*InputFeatures {
		return IterStats{}, fmt.Errorf("pipeline: batch of %d examples does not fit the session", b.Len())
	}
	if b.Len() > s.cfg.Batch {
		// Stages accept at most a batch of activations per iteration.
		return IterStats{}, fmt.Errorf("pipeline: batch of %d examples, over the session's batch size %d", b.Len(), s.cfg.Batch)
	}
	var event string
	for attempt := 0; ; attempt++ {
		st, committed, err := s.tryIter(ctx, b)
		if committed {
			s.iter++
		}
		if err == nil {
			st.Event = event
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
func (s *Session) tryIter(ctx context.Context, b data.Batch) (IterStats, bool, error) {
	n := b.Len()
	sizes := s.microSizes(n)
	x := tensor.FromSlice(b.X.Data, n, InputFeatures)
	y := tensor.New(n)
	for i, v := range b.Y {
		y.Data[i] = float32(v)
	}
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
		if r.GradSq < 0 || math.IsInf(r.GradSq, 0) || math.IsInf(r.Loss, 0) || r.Correct < 0 || r.Correct > n {
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
	st := IterStats{Iter: s.iter, Gen: s.gen, Loss: loss, Accuracy: float64(resps[S-1].Correct) / float64(n), Seconds: time.Since(start).Seconds()}
	for k, a := range s.stages {
		r := resps[k]
		t := StageTiming{
			Stage: k, Worker: s.c.worker(a.worker).Name, First: a.first, Last: a.last,
			Compute: r.Compute + commits[k].Seconds, Comm: r.Comm, Idle: r.Idle, Wall: r.Wall + commits[k].Seconds, CPU: r.CPU,
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
