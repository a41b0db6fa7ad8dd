package bridge

import (
	"context"
	"fmt"
	"math"
	"time"

	"github.com/skyhive/skyhive/tensor"
)

// StageModule is the executor module that builds pipeline stages: the
// layers of a registry model in PyTorch, in the Go model's order and under
// its parameter names (python/skyhive/stages.py).
const StageModule = "skyhive.stages:layers"

// The stage methods serve package pipeline's workers: a stage is layers
// [first, last) of a registry model held by the executor under a uid,
// with their optimizer. Busy seconds are what the executor measured of a
// call: wall time on a GPU (synchronized), the executor process's CPU
// time on the CPU.

// BuildStage makes the executor hold layers [first, last) of the registry
// model spec (the executor started with Module StageModule) under uid,
// with an optimizer: kind "adamw" (biases and LayerNorm parameters
// without weight decay) or "sgd", as Skyhive's Go optimizers. It returns
// the stage's parameter shapes by Skyhive name. The weights are the
// executor's own until Load writes others.
func (e *Executor) BuildStage(ctx context.Context, uid, spec string, first, last int, kind string, lr, weightDecay, momentum float64) (map[string][]int, error) {
	o := &StageOptim{Kind: kind, LR: lr, WeightDecay: weightDecay, Momentum: momentum}
	reply, err := e.call(ctx, execMessage{Op: "stage", UID: uid, Spec: spec, First: first, Last: last, Optim: o}, e.cfg.StartTimeout)
	if err != nil {
		return nil, err
	}
	if _, err := CheckParams(reply.Params, math.MaxInt32); err != nil {
		return nil, fmt.Errorf("bridge: executor: stage of %s: %w", spec, err)
	}
	out := make(map[string][]int, len(reply.Params))
	for _, p := range reply.Params {
		if n := tensor.NumElements(p.Shape); n > e.cfg.Elements {
			return nil, fmt.Errorf("bridge: executor: parameter %s of %d elements does not fit the shared memory of %d, through which the stage's state passes", p.Name, n, e.cfg.Elements)
		}
		out[p.Name] = p.Shape
	}
	return out, nil
}

// StageOptim is a stage's optimizer as the executor protocol carries it.
type StageOptim struct {
	Kind        string  `json:"kind"`
	LR          float64 `json:"lr"`
	WeightDecay float64 `json:"weight_decay"`
	Momentum    float64 `json:"momentum,omitempty"`
}

// StageForward runs stage uid on micro-batch micro's input x and returns
// its output, which must have the shape want, and the busy seconds; the
// executor keeps what the micro-batch's backward pass needs.
func (e *Executor) StageForward(ctx context.Context, uid string, micro int, x *tensor.Tensor, want []int) (*tensor.Tensor, float64, error) {
	n := x.Len()
	return e.stageCall(ctx, execMessage{Op: "stage_forward", UID: uid, Micro: micro, Shape: x.Shape, X: 0, Out: n, Room: tensor.NumElements(want)}, x, want, "the stage returned")
}

// StageBackward backpropagates dy through micro-batch micro's forward
// pass of stage uid; the parameters' gradients accumulate. It returns the
// gradient of the stage's input, of shape in, or nil when in is nil (the
// first stage, whose input is data), and the busy seconds.
func (e *Executor) StageBackward(ctx context.Context, uid string, micro int, dy *tensor.Tensor, in []int) (*tensor.Tensor, float64, error) {
	return e.stageCall(ctx, execMessage{Op: "stage_backward", UID: uid, Micro: micro, Shape: dy.Shape, DY: 0, Out: dy.Len()}, dy, in, "the stage's input gradient has")
}

// stageCall puts in at the start of the region, sends m, whose result
// follows in, and reads that result, which must have the shape want (no
// result when want is nil); what names the result in an error. It
// returns the busy seconds the executor measured.
func (e *Executor) stageCall(ctx context.Context, m execMessage, in *tensor.Tensor, want []int, what string) (*tensor.Tensor, float64, error) {
	n, k := in.Len(), tensor.NumElements(want)
	if err := e.fits(n, k); err != nil {
		return nil, 0, err
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	start := time.Now()
	e.put(0, in)
	reply, err := e.roundTrip(ctx, m, e.cfg.CallTimeout)
	if err != nil {
		return nil, 0, err
	}
	e.account(start, reply)
	if want == nil {
		return nil, reply.CPU, nil
	}
	if !tensor.SameShape(reply.Shape, want) {
		return nil, 0, &ExecutorError{Kind: "module", Msg: fmt.Sprintf("%s shape %v, want %v", what, reply.Shape, want)}
	}
	out := tensor.New(want...)
	copy(out.Data, e.region.floats(n, k))
	return out, reply.CPU, nil
}

// StageGradSq returns the sum of the squares of stage uid's accumulated
// gradients.
func (e *Executor) StageGradSq(ctx context.Context, uid string) (float64, error) {
	reply, err := e.call(ctx, execMessage{Op: "stage_grads", UID: uid}, e.cfg.CallTimeout)
	if err != nil {
		return 0, err
	}
	if reply.Norm == nil {
		return math.NaN(), nil
	}
	return *reply.Norm, nil
}

// StageStep multiplies stage uid's accumulated gradients by scale, takes
// an optimizer step at learning rate lr, zeroes the gradients and returns
// the busy seconds.
func (e *Executor) StageStep(ctx context.Context, uid string, lr, scale float64) (float64, error) {
	reply, err := e.call(ctx, execMessage{Op: "stage_step", UID: uid, LR: lr, Scale: scale}, e.cfg.CallTimeout)
	if err != nil {
		return 0, err
	}
	return reply.CPU, nil
}

// StageDiscard drops stage uid's kept forward passes and zeroes its
// gradients (an iteration that will not be committed).
func (e *Executor) StageDiscard(ctx context.Context, uid string) error {
	_, err := e.call(ctx, execMessage{Op: "stage_discard", UID: uid}, e.cfg.CallTimeout)
	return err
}

// StageFree makes the executor forget stage uid: its layers, optimizer
// and kept passes (and, on a GPU, their memory).
func (e *Executor) StageFree(ctx context.Context, uid string) error {
	_, err := e.call(ctx, execMessage{Op: "stage_free", UID: uid}, e.cfg.CallTimeout)
	return err
}

// stageProfileTimeout bounds one StageProfile call, which runs the whole
// model's passes several times (longer than CallTimeout on a CPU for a
// large model).
const stageProfileTimeout = 10 * time.Minute

// StageProfile times stage uid layer by layer on x with labels y (the
// cross entropy of its output), reps times after a warm-up: it returns
// each layer's median forward and backward busy seconds, each pass's wall
// and busy seconds, and, with optim, the optimizer step's busy seconds
// per parameter.
func (e *Executor) StageProfile(ctx context.Context, uid string, x, y *tensor.Tensor, reps int, optim bool) (fwd, bwd []float64, passes [][2]float64, perParam float64, err error) {
	n, m := x.Len(), y.Len()
	if err := e.fits(n, m); err != nil {
		return nil, nil, nil, 0, err
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	e.put(0, x)
	e.put(n, y)
	reply, err := e.roundTrip(ctx, execMessage{Op: "stage_profile", UID: uid, Shape: x.Shape, X: 0, YShape: y.Shape, DY: n, Reps: reps, Profile: optim}, max(e.cfg.CallTimeout, stageProfileTimeout))
	if err != nil {
		return nil, nil, nil, 0, err
	}
	if len(reply.Fwd) != len(reply.Bwd) || len(reply.Passes) != reps {
		return nil, nil, nil, 0, &ExecutorError{Kind: "protocol", Msg: fmt.Sprintf("a profile of %d/%d layers and %d passes, want %d passes", len(reply.Fwd), len(reply.Bwd), len(reply.Passes), reps)}
	}
	return reply.Fwd, reply.Bwd, reply.Passes, reply.PerParam, nil
}
