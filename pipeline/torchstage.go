package pipeline

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"time"

	"github.com/skyhive/skyhive/nn"
	"github.com/skyhive/skyhive/tensor"
)

// StageExecutor computes a worker's layers in another process: the stage
// methods of bridge.Executor, which runs them in PyTorch (package bridge is
// not imported here; the command wires it in). A stage is layers
// [first, last) of a registry model held under a uid, with its optimizer;
// busy seconds are what the executor measured of a call. Parameters and
// optimizer buffers carry the Go model's names, so the coordinator plans,
// moves and checkpoints a PyTorch stage as it does a Go one.
type StageExecutor interface {
	BuildStage(ctx context.Context, uid, spec string, first, last int, kind string, lr, weightDecay, momentum float64) (map[string][]int, error)
	StageForward(ctx context.Context, uid string, micro int, x *tensor.Tensor, want []int) (*tensor.Tensor, float64, error)
	StageBackward(ctx context.Context, uid string, micro int, dy *tensor.Tensor, in []int) (*tensor.Tensor, float64, error)
	StageGradSq(ctx context.Context, uid string) (float64, error)
	StageStep(ctx context.Context, uid string, lr, scale float64) (float64, error)
	StageDiscard(ctx context.Context, uid string) error
	StageFree(ctx context.Context, uid string) error
	StageProfile(ctx context.Context, uid string, x, y *tensor.Tensor, reps int, optim bool) (fwd, bwd []float64, passes [][2]float64, perParam float64, err error)
	State(ctx context.Context, uid string) (map[string]*tensor.Tensor, int64, error)
	Load(ctx context.Context, uid string, tensors map[string]*tensor.Tensor, step int64) error
}

// The executor's uids: the installed stage, and the whole model that
// profiling times.
const (
	execStage   = "stage"
	execProfile = "profile"
)

// execSetup bounds building a stage in the executor and writing its
// state.
const execSetup = 5 * time.Minute

// execCtx is the context of a call to the executor: ctx's values without
// its cancellation. The executor cannot take back a call it is computing,
// so a cancelled call would end it (bridge.Executor kills an executor
// whose answer it stops waiting for); an aborted iteration instead stops
// after the op in progress. Each call is bounded by the executor's own
// timeout.
func execCtx(ctx context.Context) context.Context { return context.WithoutCancel(ctx) }

func secs(s float64) time.Duration { return time.Duration(s * float64(time.Second)) }

// optimKind is the executor's name of the configured optimizer.
func (c OptimConfig) optimKind() string {
	if c.Kind == "" {
		return "adamw"
	}
	return c.Kind
}

// buildExec installs the stage's layers in x with the weights and
// optimizer state of snap. The executor's parameters must be the Go
// model's, name for name and shape for shape: a mismatch means the
// executor's skyhive package is not this binary's.
func (st *stage) buildExec(ctx context.Context, x StageExecutor, snap Snapshot) error {
	ctx, cancel := context.WithTimeout(execCtx(ctx), execSetup)
	defer cancel()
	o := st.req.Optim
	shapes, err := x.BuildStage(ctx, execStage, st.req.Model, st.req.First, st.req.Last, o.optimKind(), o.LR, o.WeightDecay, o.Momentum)
	if err != nil {
		return fmt.Errorf("pipeline: PyTorch stage: %w", err)
	}
	params := st.model.Params()
	if len(shapes) != len(params) {
		return fmt.Errorf("pipeline: the PyTorch stage of layers [%d,%d) has %d parameters, the Go model %d: install the skyhive Python package of this binary's version", st.req.First, st.req.Last, len(shapes), len(params))
	}
	tensors := make(map[string]*tensor.Tensor, 3*len(params))
	st.names = make(map[string]bool, len(params))
	for _, p := range params {
		if s, ok := shapes[p.Name]; !ok || !slices.Equal(s, p.Value.Shape) {
			return fmt.Errorf("pipeline: the PyTorch stage's parameter %s has shape %v, the Go model's %v: install the skyhive Python package of this binary's version", p.Name, s, p.Value.Shape)
		}
		v := snap.Params[p.Name]
		if v == nil {
			return fmt.Errorf("pipeline: stage weights: no %s", p.Name)
		}
		tensors[p.Name] = v
		st.names[p.Name] = true
	}
	for name, t := range snap.Optim {
		tensors[name] = t
	}
	if err := x.Load(ctx, execStage, tensors, snap.Step); err != nil {
		return fmt.Errorf("pipeline: PyTorch stage state: %w", err)
	}
	// The executor holds the layers; the Go copy only described them.
	st.exec, st.model = x, nil
	return nil
}

// runExec is iterRun.run for a stage in the executor: the op's result and
// the busy time the executor measured.
func (it *iterRun) runExec(ctx context.Context, op Op, in *tensor.Tensor) (*tensor.Tensor, time.Duration, error) {
	st := it.st
	ctx = execCtx(ctx)
	n := it.req.Sizes[op.Micro]
	if op.Backward {
		var shape []int
		if !st.first() {
			shape = append([]int{n}, st.in...)
		}
		it.dlogits[op.Micro] = nil
		dx, busy, err := st.exec.StageBackward(ctx, execStage, op.Micro, in, shape)
		return dx, secs(busy), err
	}
	out, busy, err := st.exec.StageForward(ctx, execStage, op.Micro, in, append([]int{n}, st.out...))
	if err != nil {
		return nil, 0, err
	}
	if st.last() {
		it.loss(op, out)
	}
	return out, secs(busy), nil
}

// fetchExec returns the executor stage's weights and optimizer state.
func (st *stage) fetchExec(ctx context.Context) (Snapshot, error) {
	ts, step, err := st.exec.State(execCtx(ctx), execStage)
	if err != nil {
		return Snapshot{}, err
	}
	snap := Snapshot{Params: map[string]*tensor.Tensor{}, Optim: map[string]*tensor.Tensor{}, Step: step}
	for name, t := range ts {
		if st.names[name] {
			snap.Params[name] = t
		} else {
			snap.Optim[name] = t
		}
	}
	return snap, nil
}

// profileExec is onProfile's measurement through the executor: the whole
// model built there under execProfile, passes at req.Batch followed by
// the emulated slowdown (after), and the layers' busy times at each
// calibration size.
func (w *Worker) profileExec(ctx context.Context, req profileReq, model *nn.Sequential, info ModelInfo, resp *profileResp, after func(wall, busy time.Duration)) error {
	x := w.cfg.Executor
	if err := ctx.Err(); err != nil {
		return err
	}
	ctx = execCtx(ctx)
	bctx, cancel := context.WithTimeout(ctx, execSetup)
	defer cancel()
	o := req.Optim
	if o.LR == 0 {
		o = OptimConfig{Kind: "sgd", LR: 1}
	}
	if _, err := x.BuildStage(bctx, execProfile, req.Model, 0, model.Len(), o.optimKind(), o.LR, o.WeightDecay, o.Momentum); err != nil {
		return fmt.Errorf("pipeline: profiling in PyTorch: %w", err)
	}
	// The whole model leaves the executor's device when profiling ends.
	defer func() { _ = x.StageFree(ctx, execProfile) }()
	sample := func(n int) (*tensor.Tensor, *tensor.Tensor) {
		in, y := profileBatch(info, req.Seed, n)
		labels := tensor.New(len(y))
		for i, v := range y {
			labels.Data[i] = float32(v)
		}
		return in, labels
	}
	in, y := sample(req.Batch)
	_, _, passes, perParam, err := x.StageProfile(ctx, execProfile, in, y, req.Reps, req.Optim.LR > 0)
	if err != nil {
		return fmt.Errorf("pipeline: profiling in PyTorch: %w", err)
	}
	for _, p := range passes {
		after(secs(p[0]), secs(p[1]))
	}
	resp.OptimPerParam = perParam
	for _, n := range req.Calibrate {
		in, y := sample(n)
		fwd, bwd, _, _, err := x.StageProfile(ctx, execProfile, in, y, req.Reps, false)
		if err != nil {
			return fmt.Errorf("pipeline: profiling in PyTorch: %w", err)
		}
		if len(fwd) != model.Len() {
			return fmt.Errorf("pipeline: the PyTorch profile has %d layers, the model %d", len(fwd), model.Len())
		}
		resp.Fwd, resp.Bwd = append(resp.Fwd, fwd), append(resp.Bwd, bwd)
	}
	return nil
}

// profileBatch is a batch of n random examples of the model and their
// labels, from seed: token ids for a language model, normal features for
// an image classifier.
func profileBatch(info ModelInfo, seed uint64, n int) (*tensor.Tensor, []int) {
	rng := rand.New(rand.NewPCG(seed, 7))
	x := tensor.New(append([]int{n}, info.Input...)...)
	y := make([]int, n*info.Labels)
	if info.lm() {
		// Random token ids and labels: the model's real input shape.
		for i := range x.Data {
			x.Data[i] = float32(rng.IntN(info.Classes))
		}
		for i := range y {
			y[i] = rng.IntN(info.Classes)
		}
	} else {
		tensor.FillNormal(x.Data, rng, 0, 1)
		for i := range y {
			y[i] = i % 10
		}
	}
	return x, y
}
