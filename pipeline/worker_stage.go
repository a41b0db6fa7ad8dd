package pipeline

import (
	"context"
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/skyhive/skyhive/alloc"
	"github.com/skyhive/skyhive/nn"
	"github.com/skyhive/skyhive/optim"
	"github.com/skyhive/skyhive/tensor"
	"github.com/skyhive/skyhive/wire"
)

// stage is the worker's current assignment.
type stage struct {
	req     setupReq
	model   *nn.Sequential
	params  []*nn.Param
	opt     optim.Optimizer
	prev    peer.AddrInfo
	next    peer.AddrInfo
	in, out []int     // per-example input and output shapes
	info    ModelInfo // the whole model's examples (inputs, labels)
	ready   int       // iteration whose gradients await a commit, or −1
	iter    int       // iterations committed

	// exec, if set, holds the layers and their optimizer (a PyTorch
	// stage); model and params are then nil. names are the stage's
	// parameter names.
	exec  StageExecutor
	names map[string]bool
}

// discard drops an iteration's gradients (and, in the executor, its kept
// forward passes).
func (s *stage) discard(ctx context.Context) error {
	if s.exec != nil {
		return s.exec.StageDiscard(execCtx(ctx), execStage)
	}
	nn.ZeroGrad(s.params)
	return nil
}

func (s *stage) first() bool { return s.req.Stage == 0 }

// cold says the stage runs its first iteration since it was built.
func (s *stage) cold() bool { return s.iter == s.req.Iter }
func (s *stage) last() bool { return s.req.Stage == s.req.Stages-1 }

// work names the stage's work for steady emulated devices.
func (s *stage) work() stageWork {
	return stageWork{model: s.req.Model, first: s.req.First, last: s.req.Last, input: s.first(), head: s.last()}
}

// onSetup installs a stage (or releases the worker when Stage < 0).
func (w *Worker) onSetup(ctx context.Context, b []byte) ([]byte, error) {
	var req setupReq
	ts, err := decodeMsg(b, &req, bulkLimits)
	if err != nil {
		return nil, err
	}
	// Switch generations first: activations of the old plan are refused
	// from now on, and a running iteration is stopped.
	w.mu.Lock()
	if req.Gen <= w.gen {
		w.mu.Unlock()
		return nil, fmt.Errorf("pipeline: stale setup generation %d (have %d)", req.Gen, w.gen)
	}
	w.gen = req.Gen
	if w.cancelIter != nil {
		w.cancelIter(errors.New("pipeline: re-planned"))
	}
	w.box = newInbox(req.Iter, nil, nil)
	w.prev, w.next = "", ""
	w.mu.Unlock()

	w.runMu.Lock()
	defer w.runMu.Unlock()
	w.st = nil
	if req.Stage < 0 {
		w.log.Info("pipeline: released", "gen", req.Gen)
		return nil, nil
	}
	st, err := w.buildStage(ctx, req, ts)
	if err != nil {
		return nil, err
	}
	w.mu.Lock()
	if w.gen == req.Gen {
		box := newInbox(req.Iter, st.in, st.out)
		box.rows = req.Batch // a micro-batch holds at most the batch
		w.box = box
		w.prev, w.next = st.prev.ID, st.next.ID
	}
	w.mu.Unlock()
	w.st = st
	w.log.Info("pipeline: stage installed", "gen", req.Gen, "stage", req.Stage, "layers", fmt.Sprintf("[%d,%d)", req.First, req.Last))
	return nil, nil
}

func (w *Worker) buildStage(ctx context.Context, req setupReq, ts []wire.Named) (*stage, error) {
	if req.Stages < 1 || req.Stages > maxStages || req.Stage >= req.Stages || req.Batch < 1 || req.Batch > maxBatch || req.Iter < 0 || req.Step < 0 {
		return nil, fmt.Errorf("pipeline: bad setup %d/%d batch %d", req.Stage, req.Stages, req.Batch)
	}
	if err := req.Optim.Validate(); err != nil {
		return nil, err
	}
	full, info, err := buildModel(req.Model, req.Seed)
	if err != nil {
		return nil, err
	}
	if req.First < 0 || req.First >= req.Last || req.Last > full.Len() {
		return nil, fmt.Errorf("pipeline: layers [%d,%d) of a %d-layer model", req.First, req.Last, full.Len())
	}
	if (req.Stage == 0) != (req.First == 0) || (req.Stage == req.Stages-1) != (req.Last == full.Len()) {
		return nil, fmt.Errorf("pipeline: stage %d of %d cannot hold layers [%d,%d) of %d", req.Stage, req.Stages, req.First, req.Last, full.Len())
	}
	st := &stage{req: req, model: full.Slice(req.First, req.Last), info: info, ready: -1, iter: req.Iter}
	snap, err := snapshotFrom(namedMap(ts), req.Step)
	if err != nil {
		return nil, err
	}
	st.in = full.Slice(0, req.First).Cost(append([]int{1}, info.Input...)).OutShape[1:]
	cost := st.model.Cost(append([]int{req.Batch}, st.in...))
	st.out = cost.OutShape[1:]
	if need := alloc.StateCopies*4*cost.Params + cost.ActivationBytes; w.cfg.MemCap > 0 && need > w.cfg.MemCap {
		return nil, fmt.Errorf("pipeline: stage needs %d bytes, over the worker's memory cap of %d", need, w.cfg.MemCap)
	}
	if w.cfg.Executor != nil {
		if err := st.buildExec(ctx, w.cfg.Executor, snap); err != nil {
			return nil, err
		}
	} else {
		st.params = st.model.Params()
		if err := nn.ImportParams(st.params, snap.Params); err != nil {
			return nil, fmt.Errorf("pipeline: stage weights: %w", err)
		}
		st.opt = req.Optim.NewOptimizer(st.params)
		if err := st.opt.LoadState(optim.State{Step: req.Step, Tensors: snap.Optim}); err != nil {
			return nil, fmt.Errorf("pipeline: stage optimizer state: %w", err)
		}
	}
	if st.prev, err = req.Prev.addrInfo(); err != nil {
		return nil, err
	}
	if st.next, err = req.Next.addrInfo(); err != nil {
		return nil, err
	}
	if (st.prev.ID == "") != st.first() || (st.next.ID == "") != st.last() {
		return nil, errors.New("pipeline: setup neighbours do not match the stage position")
	}
	if req.Pin {
		for _, ai := range []peer.AddrInfo{st.prev, st.next} {
			if ai.ID != "" && len(ai.Addrs) > 0 {
				pinAddrs(w.tr, ai.ID, ai.Addrs)
			}
		}
	}
	return st, nil
}

// onCommit steps the optimizer over the gradients of a finished iteration.
func (w *Worker) onCommit(ctx context.Context, b []byte) ([]byte, error) {
	var req commitReq
	if err := decodeHeader(b, &req); err != nil {
		return nil, err
	}
	w.runMu.Lock()
	defer w.runMu.Unlock()
	st := w.st
	if st == nil || st.req.Gen != req.Gen || st.ready != req.Iter {
		return nil, fmt.Errorf("pipeline: commit of iteration %d in generation %d does not match the worker's state", req.Iter, req.Gen)
	}
	if !(req.LR > 0) || !(req.Scale > 0) || math.IsInf(req.LR+req.Scale, 0) {
		return nil, fmt.Errorf("pipeline: bad commit lr %v scale %v", req.LR, req.Scale)
	}
	t0 := time.Now()
	clk := startOp()
	var execBusy float64
	if st.exec != nil {
		var err error
		if execBusy, err = st.exec.StageStep(execCtx(ctx), execStage, req.LR, req.Scale); err != nil {
			return nil, fmt.Errorf("pipeline: commit: %w", err)
		}
	} else {
		if req.Scale != 1 {
			for _, p := range st.params {
				tensor.Scale(float32(req.Scale), p.Grad.Data)
			}
		}
		st.opt.SetLR(req.LR)
		st.opt.Step()
		st.opt.ZeroGrad()
	}
	wall, busy := clk.stop()
	if st.exec != nil {
		busy = secs(execBusy)
	}
	w.throttle(ctx, wall, w.emulatedBusy(opKey{work: st.work(), commit: true}, busy, st.cold()))
	st.ready, st.iter = -1, req.Iter+1
	return encodeMsg(commitResp{Seconds: time.Since(t0).Seconds()}, nil)
}

// onAbort stops a running iteration of the given generation.
func (w *Worker) onAbort(_ context.Context, b []byte) ([]byte, error) {
	var req abortReq
	if err := decodeHeader(b, &req); err != nil {
		return nil, err
	}
	w.mu.Lock()
	w.aborted = req
	if w.gen == req.Gen && w.cancelIter != nil {
		w.cancelIter(fmt.Errorf("pipeline: iteration %d aborted by the coordinator", req.Iter))
	}
	w.mu.Unlock()
	return nil, nil
}

// onFetch returns the stage's weights and optimizer state.
func (w *Worker) onFetch(ctx context.Context, b []byte) ([]byte, error) {
	var req fetchReq
	if err := decodeHeader(b, &req); err != nil {
		return nil, err
	}
	w.runMu.Lock()
	defer w.runMu.Unlock()
	st := w.st
	if st == nil || st.req.Gen != req.Gen {
		return nil, fmt.Errorf("pipeline: no stage of generation %d to fetch", req.Gen)
	}
	var snap Snapshot
	if st.exec != nil {
		var err error
		if snap, err = st.fetchExec(ctx); err != nil {
			return nil, fmt.Errorf("pipeline: fetch: %w", err)
		}
	} else {
		os := st.opt.State()
		snap = Snapshot{Params: nn.ExportParams(st.params), Optim: os.Tensors, Step: os.Step}
	}
	return encodeMsg(fetchResp{Step: snap.Step, Iter: st.iter}, mapNamed(snap.tensors()))
}
