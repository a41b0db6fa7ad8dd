package pipeline

import (
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/skyhive/skyhive/checkpoint"
	"github.com/skyhive/skyhive/nn"
	"github.com/skyhive/skyhive/tensor"
)

// initialSnapshot is the model's initial weights and a fresh optimizer
// state, or the checkpoint when resuming.
func (s *Session) initialSnapshot() (Snapshot, error) {
	if s.cfg.Resume {
		snap, iter, err := s.load()
		if err == nil {
			s.iter = iter
			fmt.Fprintf(s.cfg.Log, "resumed from %s at iteration %d\n", s.cfg.Checkpoint, iter)
			return snap, nil
		}
		if !errors.Is(err, os.ErrNotExist) {
			return Snapshot{}, err
		}
	}
	params := s.ref.Params()
	st := s.cfg.Optim.NewOptimizer(params).State()
	return Snapshot{Params: nn.ExportParams(params), Optim: st.Tensors, Step: st.Step}, nil
}

// Snapshot fetches every stage's weights and optimizer state.
func (s *Session) Snapshot(ctx context.Context) (Snapshot, error) {
	out := Snapshot{}
	for k, a := range s.stages {
		part, err := s.fetch(ctx, a)
		if err != nil {
			return Snapshot{}, &stageError{worker: a.worker, err: fmt.Errorf("pipeline: fetching stage %d: %w", k, err)}
		}
		out.merge(part)
	}
	return out, nil
}

// fetch returns the state of stage a: only its own layers' parameters
// and optimizer state, with their shapes and finite values, so a broken
// stage can neither write into other stages' layers nor poison the
// checkpoint.
func (s *Session) fetch(ctx context.Context, a assignment) (Snapshot, error) {
	cctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	var resp fetchResp
	ts, err := s.c.call(cctx, a.worker, ProtoFetch, fetchReq{Gen: s.gen}, nil, &resp, bulkLimits)
	if err != nil {
		return Snapshot{}, err
	}
	snap, err := snapshotFrom(namedMap(ts), resp.Step)
	if err != nil {
		return Snapshot{}, err
	}
	params := s.ref.Slice(a.first, a.last).Params()
	own, err := snap.forParams(params)
	if err != nil {
		return Snapshot{}, err
	}
	for _, p := range params {
		if v := own.Params[p.Name]; !slices.Equal(v.Shape, p.Value.Shape) {
			return Snapshot{}, fmt.Errorf("pipeline: fetched %s of shape %v, want %v", p.Name, v.Shape, p.Value.Shape)
		}
	}
	for _, m := range []map[string]*tensor.Tensor{own.Params, own.Optim} {
		for name, t := range m {
			for _, v := range t.Data {
				if math.IsNaN(float64(v)) || math.IsInf(float64(v), 0) {
					return Snapshot{}, fmt.Errorf("pipeline: fetched %s holds %v", name, v)
				}
			}
		}
	}
	return own, nil
}

// gather collects the current state from the live stages and fills what
// the dead ones held from the checkpoint.
func (s *Session) gather(ctx context.Context) (Snapshot, error) {
	out := Snapshot{}
	parts := make([]Snapshot, len(s.stages))
	errs := make([]error, len(s.stages))
	var wg sync.WaitGroup
	for k, a := range s.stages {
		if !s.c.worker(a.worker).alive(s.c) {
			errs[k] = errors.New("dead")
			continue
		}
		wg.Go(func() { parts[k], errs[k] = s.fetch(ctx, a) })
	}
	wg.Wait()
	if ctx.Err() != nil {
		return Snapshot{}, ctx.Err()
	}
	for k, a := range s.stages {
		if errs[k] != nil {
			s.c.markDead(a.worker)
			continue
		}
		out.merge(parts[k])
	}
	missing := 0
	for _, p := range s.ref.Params() {
		if _, ok := out.Params[p.Name]; !ok {
			missing++
		}
	}
	if missing > 0 || len(s.stages) == 0 {
		ck, iter, err := s.load()
		if err != nil {
			return Snapshot{}, fmt.Errorf("pipeline: %d parameters lost with their workers and no checkpoint: %w", missing, err)
		}
		fmt.Fprintf(s.cfg.Log, "%s restoring %d parameters from the checkpoint of iteration %d\n", time.Now().Format("15:04:05.000"), missing, iter)
		out.merge(ck)
	}
	if out.Step == 0 {
		out.Step = int64(s.iter)
	}
	return out, nil
}

// save writes a snapshot to the checkpoint file atomically.
func (s *Session) save(snap Snapshot) error {
	meta := map[string]string{
		"format": "skyhive-pipeline", "model": s.cfg.Model, "seed": strconv.FormatUint(s.cfg.Seed, 10),
		"iter": strconv.Itoa(s.iter), "step": strconv.FormatInt(snap.Step, 10),
	}
	if err := checkpoint.Save(s.cfg.Checkpoint, snap.tensors(), meta); err != nil {
		return fmt.Errorf("pipeline: checkpoint: %w", err)
	}
	return nil
}

// load reads the checkpoint file.
func (s *Session) load() (Snapshot, int, error) {
	f, err := checkpoint.Load(s.cfg.Checkpoint)
	if err != nil {
		return Snapshot{}, 0, err
	}
	if f.Meta["model"] != s.cfg.Model || f.Meta["seed"] != strconv.FormatUint(s.cfg.Seed, 10) {
		return Snapshot{}, 0, fmt.Errorf("pipeline: checkpoint %s is of model %q seed %s, not %q seed %d", s.cfg.Checkpoint, f.Meta["model"], f.Meta["seed"], s.cfg.Model, s.cfg.Seed)
	}
	iter, err1 := strconv.Atoi(f.Meta["iter"])
	step, err2 := strconv.ParseInt(f.Meta["step"], 10, 64)
	if err1 != nil || err2 != nil || iter < 0 || step < 0 {
		return Snapshot{}, 0, fmt.Errorf("pipeline: checkpoint %s lacks iteration metadata", s.cfg.Checkpoint)
	}
	snap, err := snapshotFrom(f.Tensors, step)
	return snap, iter, err
}

// checkpoint snapshots all stages to the checkpoint file.
func (s *Session) checkpoint(ctx context.Context) error {
	snap, err := s.Snapshot(ctx)
	if err != nil {
		return err
	}
	return s.save(snap)
}
