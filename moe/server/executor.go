package server

import (
	"context"
	"fmt"
	"io"
	"maps"
	"strings"
	"time"

	"github.com/skyhive/skyhive/optim"
	"github.com/skyhive/skyhive/tensor"
)

// Executor computes experts in another process: bridge.Executor runs the
// user's PyTorch modules (package bridge depends on this one, not the
// other way round). The server keeps everything else (batching,
// guards, statistics, declarations, checkpoints); the executor holds each
// expert's module and optimizer. Calls for one expert come one at a time.
type Executor interface {
	// Build creates the expert uid with its initial weights (from seed
	// and uid) and returns its number of parameters.
	Build(ctx context.Context, uid string, hidden int, seed uint64) (int64, error)
	// Forward returns the expert's output on x (x's shape).
	Forward(ctx context.Context, uid string, x *tensor.Tensor) (*tensor.Tensor, error)
	// Backward recomputes the forward pass on x, backpropagates dy and
	// returns dx; parameter gradients accumulate (zero: afresh), and with
	// step > 0 the mean of the last step batches' gradients, clipped to
	// clip, is applied unless it is not finite.
	// It returns dx, the gradient norm of the step (NaN without one) and
	// whether the step was taken.
	Backward(ctx context.Context, uid string, x, dy *tensor.Tensor, zero bool, step int, clip float64) (*tensor.Tensor, float64, bool, error)
	// State returns the expert's parameters and optimizer moments
	// ("opt/…") and its step counter; Load sets them.
	State(ctx context.Context, uid string) (map[string]*tensor.Tensor, int64, error)
	Load(ctx context.Context, uid string, tensors map[string]*tensor.Tensor, step int64) error
}

// executorSetup bounds building or loading one expert in the executor.
const executorSetup = 5 * time.Minute

// build creates e in the executor if it is not there yet. The caller holds
// e.mu.
func (e *expert) build(ctx context.Context) error {
	if e.built {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, executorSetup)
	defer cancel()
	if _, err := e.cfg.Executor.Build(ctx, e.uid, e.cfg.Hidden, e.cfg.Seed); err != nil {
		return fmt.Errorf("expert %s: build: %w", e.uid, err)
	}
	e.built = true
	e.pendingRows, e.pendingBatches = 0, 0
	return nil
}

// runExecutor is run for an expert computed by the executor: the same
// gradient accumulation (Config.StepRows), clipping and skipping of
// non-finite steps as a Go expert, done by the executor's optimizer. The
// caller holds e.mu.
func (e *expert) runExecutor(backward bool, x, dy *tensor.Tensor) (*tensor.Tensor, outcome, error) {
	ctx := context.Background() // each call is bounded by the executor's CallTimeout
	if err := e.build(ctx); err != nil {
		return nil, outcome{}, err
	}
	if !backward {
		y, err := e.cfg.Executor.Forward(ctx, e.uid, x)
		return y, outcome{}, err
	}
	zero := e.pendingBatches == 0
	rows := e.pendingRows + x.Shape[0]
	step := 0
	if rows >= e.cfg.StepRows {
		step = e.pendingBatches + 1
	}
	clip := 0.0
	if e.cfg.ClipNorm > 0 {
		clip = e.cfg.ClipNorm
	}
	dx, norm, stepped, err := e.cfg.Executor.Backward(ctx, e.uid, x, dy, zero, step, clip)
	if err != nil {
		// The gradients accumulated so far are in an unknown state: the
		// next batch starts afresh.
		e.pendingRows, e.pendingBatches = 0, 0
		return nil, outcome{}, fmt.Errorf("expert %s: %w", e.uid, err)
	}
	if step == 0 {
		e.pendingRows, e.pendingBatches = rows, e.pendingBatches+1
		return dx, outcome{}, nil
	}
	e.pendingRows, e.pendingBatches = 0, 0
	return dx, outcome{stepped: stepped, skipped: !stepped, clipped: stepped && clip > 0 && norm > clip, norm: norm}, nil
}

// executorState returns e's weights and optimizer state as Save writes
// them (nil when e was never built). The caller holds e.mu.
func (e *expert) executorState() (map[string]*tensor.Tensor, optim.State, error) {
	if !e.built {
		return nil, optim.State{}, nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), executorSetup)
	defer cancel()
	all, step, err := e.cfg.Executor.State(ctx, e.uid)
	if err != nil {
		return nil, optim.State{}, fmt.Errorf("expert %s: state: %w", e.uid, err)
	}
	params := map[string]*tensor.Tensor{}
	st := optim.State{Step: step, Tensors: map[string]*tensor.Tensor{}}
	for name, t := range all {
		if rest, ok := strings.CutPrefix(name, "opt/"); ok {
			st.Tensors[rest] = t
		} else {
			params[name] = t
		}
	}
	return params, st, nil
}

// loadExecutor loads e's state from a checkpoint's tensors (named as
// executorState names them, without the UID). The caller holds e.mu.
func (e *expert) loadExecutor(params map[string]*tensor.Tensor, st optim.State) error {
	ctx, cancel := context.WithTimeout(context.Background(), executorSetup)
	defer cancel()
	if err := e.build(ctx); err != nil {
		return err
	}
	all := maps.Clone(params)
	for name, t := range st.Tensors {
		all["opt/"+name] = t
	}
	if err := e.cfg.Executor.Load(ctx, e.uid, all, st.Step); err != nil {
		return fmt.Errorf("moe/server: checkpoint of %s: %w", e.uid, err)
	}
	return nil
}

// RoleExecutor is the executor of a server role (`skyhive server
// --executor python`): an Executor that runs as a process of its own.
type RoleExecutor interface {
	Executor
	// Done is closed when the executor has exited; Err says why.
	Done() <-chan struct{}
	Err() error
	// Torch and Device describe it: PyTorch's version, the device.
	Torch() string
	Device() string
	Close() error
}

// ExecutorSpec is what RoleConfig.StartExecutor starts: the user's
// Module run by the interpreter Python on Device, a shared memory of
// Elements float32s, LR for its optimizers, its output to Log.
type ExecutorSpec struct {
	Module, Python, Device string
	Elements               int
	LR                     float64
	Log                    io.Writer
}
