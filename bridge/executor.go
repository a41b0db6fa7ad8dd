package bridge

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"os"
	"os/exec"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/skyhive/skyhive/tensor"
)

// ExecutorVersion is the executor protocol this package speaks; the
// executor (python/skyhive/executor.py) refuses another.
const ExecutorVersion = 1

// ExecutorConfig configures StartExecutor. Zero fields take the defaults
// shown.
type ExecutorConfig struct {
	// Module names the user's function that builds one module,
	// "package.module:function" (required): function(hidden) returns a
	// torch.nn.Module whose output has its input's shape.
	Module string
	// Python is the interpreter that runs the executor: $SKYHIVE_PYTHON,
	// else python3 on PATH. It must import torch, the skyhive package
	// (python/) and Module.
	Python string
	// Device is where the modules compute: "auto" (default: CUDA when
	// the executor sees a GPU, else the CPU), "cpu", "cuda" or "cuda:N".
	Device string
	// Elements sizes the shared-memory region in float32 elements
	// (required): a call's input, output gradient and output must fit in
	// it, and so must every parameter tensor (checkpoints cross it one
	// tensor at a time). Pages that are never touched take no memory.
	Elements int
	// LR and WeightDecay configure each module's AdamW (1e-3, 0).
	LR, WeightDecay float64
	// StartTimeout bounds the start: importing torch and Module and
	// initialising the device (2 min). CallTimeout bounds one call (2
	// min): an executor that takes longer is taken to hang and is killed.
	StartTimeout, CallTimeout time.Duration
	// Env is added to the executor's environment, e.g. "PYTHONPATH=…".
	Env []string
	// Log receives the executor's standard output and error (nil:
	// discarded); its last lines are kept for error messages either way.
	Log io.Writer
}

func (c *ExecutorConfig) defaults() error {
	if c.Module == "" {
		return errors.New("bridge: executor: no module: give --module package.module:function")
	}
	if c.Elements <= 0 {
		return errors.New("bridge: executor: ExecutorConfig.Elements must be positive")
	}
	if c.Python == "" {
		c.Python = os.Getenv("SKYHIVE_PYTHON")
	}
	if c.Python == "" {
		c.Python = "python3"
	}
	if c.Device == "" {
		c.Device = "auto"
	}
	if c.LR == 0 {
		c.LR = 1e-3
	}
	if c.StartTimeout <= 0 {
		c.StartTimeout = 2 * time.Minute
	}
	if c.CallTimeout <= 0 {
		c.CallTimeout = 2 * time.Minute
	}
	return nil
}

// ExecutorError is a call the executor refused or failed; the executor
// goes on serving. Kind says whose fault it is: "config" (the module, the
// device, a checkpoint that does not fit), "module" (the user's module
// raised, or returned the wrong shape), "protocol" (a bug on either side).
type ExecutorError struct {
	Kind, Msg string
}

func (e *ExecutorError) Error() string { return "executor: " + e.Msg }

// ErrExecutorGone wraps every error of calls after the executor exited or
// was killed for hanging; the executor does not come back.
var ErrExecutorGone = errors.New("bridge: the PyTorch executor is gone")

// execMessage is one message of the executor protocol (see
// python/skyhive/executor.py); Op says which fields apply.
type execMessage struct {
	Op string `json:"op"`

	// hello / ready
	Version     int     `json:"version,omitempty"`
	Module      string  `json:"module,omitempty"`
	Device      string  `json:"device,omitempty"`
	LR          float64 `json:"lr,omitempty"`
	WeightDecay float64 `json:"weight_decay,omitempty"`
	Torch       string  `json:"torch,omitempty"`

	// build / built
	UID    string      `json:"uid,omitempty"`
	Hidden int         `json:"hidden,omitempty"`
	Seed   uint64      `json:"seed,omitempty"`
	Params []ParamSpec `json:"params,omitempty"`

	// forward, backward, read, write: element offsets into the region.
	Shape []int `json:"shape,omitempty"`
	X     int   `json:"x"`
	DY    int   `json:"dy"`
	Out   int   `json:"out"`
	At    int   `json:"at"`
	// backward: zero the gradients first; take an optimizer step on the
	// mean of the last Step batches' gradients (0: no step), clipped to
	// Clip (0: not clipped).
	Zero bool    `json:"zero,omitempty"`
	Step int     `json:"step,omitempty"`
	Clip float64 `json:"clip,omitempty"`
	// done
	Norm    *float64 `json:"norm,omitempty"`
	Stepped bool     `json:"stepped,omitempty"`
	Seconds float64  `json:"seconds,omitempty"`
	Memory  int64    `json:"memory,omitempty"`
	CPU     float64  `json:"cpu,omitempty"`
	// stage: the registry model, its layers [First, Last) and their
	// optimizer; stage_forward / stage_backward: the micro-batch, and the
	// room left for the output.
	Spec  string      `json:"spec,omitempty"`
	First int         `json:"first,omitempty"`
	Last  int         `json:"last,omitempty"`
	Optim *StageOptim `json:"optim,omitempty"`
	Micro int         `json:"micro,omitempty"`
	Room  int         `json:"room,omitempty"`
	Scale float64     `json:"scale,omitempty"`
	// stage_profile: labels at DY of shape YShape, Reps timed passes,
	// optimizer steps timed too with Profile.
	YShape   []int        `json:"yshape,omitempty"`
	Reps     int          `json:"reps,omitempty"`
	Profile  bool         `json:"optim_steps,omitempty"`
	Fwd      []float64    `json:"fwd,omitempty"`
	Bwd      []float64    `json:"bwd,omitempty"`
	Passes   [][2]float64 `json:"passes,omitempty"`
	PerParam float64      `json:"per_param,omitempty"`
	// state, read, write
	Tensors []ParamSpec `json:"tensors,omitempty"`
	Name    string      `json:"name,omitempty"`
	// error
	Kind  string `json:"kind,omitempty"`
	Error string `json:"error,omitempty"`
}

// ExecutorStats counts an executor's calls.
type ExecutorStats struct {
	// Calls counts forward and backward calls answered.
	Calls int64 `json:"calls"`
	// Seconds is their time as the role saw it; ComputeSeconds the part
	// the executor spent computing (the rest is the bridge: copies
	// through shared memory, messages, scheduling).
	Seconds        float64 `json:"seconds"`
	ComputeSeconds float64 `json:"compute_seconds"`
	// Memory is the executor's peak memory on its device (bytes; the
	// process's peak resident set on the CPU).
	Memory int64 `json:"memory"`
}

// BridgeShare is the part of the calls' time not spent computing.
func (s ExecutorStats) BridgeShare() float64 {
	if s.Seconds <= 0 {
		return 0
	}
	return max(0, 1-s.ComputeSeconds/s.Seconds)
}

// Executor is a running PyTorch executor: a child process that holds the
// user's modules and computes their forward and backward passes and their
// optimizer steps. Calls are serialized; each is bounded by CallTimeout.
type Executor struct {
	cfg    ExecutorConfig
	cmd    *exec.Cmd
	conn   *net.UnixConn
	region *region
	log    *tail
	device string
	torch  string

	mu    sync.Mutex // one call at a time
	stats ExecutorStats

	done    chan struct{} // closed when the process has exited
	goneMu  sync.Mutex
	gone    error
	closing bool
}

// StartExecutor starts `python3 -m skyhive.executor`, hands it the control
// socket and the shared memory as inherited descriptors (no other process
// can reach either), and waits until it has imported the module and
// initialised its device. An error says what to fix: the interpreter,
// torch, the module path, the device.
func StartExecutor(ctx context.Context, cfg ExecutorConfig) (*Executor, error) {
	if err := cfg.defaults(); err != nil {
		return nil, err
	}
	python, err := exec.LookPath(cfg.Python)
	if err != nil {
		return nil, fmt.Errorf("bridge: executor: no Python interpreter %q (%w): install python3 with torch, or set SKYHIVE_PYTHON / --python", cfg.Python, err)
	}
	r, err := newRegion(cfg.Elements)
	if err != nil {
		return nil, err
	}
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		r.close()
		return nil, fmt.Errorf("bridge: executor: socketpair: %w", err)
	}
	ours := os.NewFile(uintptr(fds[0]), "executor-control")
	theirs := os.NewFile(uintptr(fds[1]), "executor-control-child")
	shmFD, err := unix.FcntlInt(uintptr(r.fd), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		ours.Close()
		theirs.Close()
		r.close()
		return nil, fmt.Errorf("bridge: executor: %w", err)
	}
	shm := os.NewFile(uintptr(shmFD), "executor-shm")
	log := &tail{max: 4096, w: cfg.Log}
	cmd := exec.Command(python, "-m", "skyhive.executor",
		"--control-fd", "3", "--shm-fd", "4", "--shm-bytes", fmt.Sprint(4*cfg.Elements))
	cmd.ExtraFiles = []*os.File{theirs, shm}
	cmd.Stdout, cmd.Stderr = log, log
	cmd.Env = append(os.Environ(), cfg.Env...)
	cmd.SysProcAttr = &unix.SysProcAttr{Pdeathsig: unix.SIGKILL}
	err = cmd.Start()
	theirs.Close()
	shm.Close()
	if err != nil {
		ours.Close()
		r.close()
		return nil, fmt.Errorf("bridge: executor: start %s: %w", python, err)
	}
	fc, err := net.FileConn(ours)
	ours.Close()
	if err != nil {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		r.close()
		return nil, fmt.Errorf("bridge: executor: %w", err)
	}
	e := &Executor{cfg: cfg, cmd: cmd, conn: fc.(*net.UnixConn), region: r, log: log, done: make(chan struct{})}
	go e.wait()
	reply, err := e.call(ctx, execMessage{
		Op: "hello", Version: ExecutorVersion, Module: cfg.Module, Device: cfg.Device,
		LR: cfg.LR, WeightDecay: cfg.WeightDecay,
	}, cfg.StartTimeout)
	if err != nil {
		e.kill()
		<-e.done
		e.region.close()
		if errors.Is(err, ErrExecutorGone) && strings.Contains(e.log.String(), "No module named skyhive") {
			return nil, fmt.Errorf("bridge: executor: %s cannot import the skyhive package: install it (pip install ./python in the repository) or put python/ on PYTHONPATH: %w", python, err)
		}
		return nil, fmt.Errorf("bridge: executor: start: %w", err)
	}
	e.device, e.torch = reply.Device, reply.Torch
	return e, nil
}

// wait reaps the process and records why it ended.
func (e *Executor) wait() {
	err := e.cmd.Wait()
	e.goneMu.Lock()
	if e.gone == nil {
		if e.closing {
			e.gone = fmt.Errorf("%w: closed", ErrExecutorGone)
		} else {
			e.gone = fmt.Errorf("%w: pid %d exited (%v)%s", ErrExecutorGone, e.cmd.Process.Pid, err, e.log.describe())
		}
	}
	e.goneMu.Unlock()
	_ = e.conn.Close() // wakes a call waiting for an answer
	close(e.done)
}

// kill ends a hung or unwanted executor.
func (e *Executor) kill() { _ = e.cmd.Process.Kill() }

// Device is the device the executor computes on ("cpu", "cuda:0").
func (e *Executor) Device() string { return e.device }

// Torch is the executor's PyTorch version.
func (e *Executor) Torch() string { return e.torch }

// Done is closed when the executor has exited.
func (e *Executor) Done() <-chan struct{} { return e.done }

// Err says why the executor exited (nil while it runs).
func (e *Executor) Err() error {
	e.goneMu.Lock()
	defer e.goneMu.Unlock()
	return e.gone
}

// Stats returns the counters of the calls so far.
func (e *Executor) Stats() ExecutorStats {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.stats
}

// Close asks the executor to exit, kills it if it has not within 5 s, and
// releases the shared memory.
func (e *Executor) Close() error {
	e.goneMu.Lock()
	e.closing = true
	e.goneMu.Unlock()
	e.mu.Lock()
	if e.Err() == nil {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		_, _ = e.roundTrip(ctx, execMessage{Op: "close"}, 5*time.Second)
		cancel()
	}
	e.mu.Unlock()
	select {
	case <-e.done:
	case <-time.After(5 * time.Second):
		e.kill()
		<-e.done
	}
	e.mu.Lock()
	e.region.close()
	e.mu.Unlock()
	return nil
}

// call sends m and returns the answer, within timeout and ctx.
func (e *Executor) call(ctx context.Context, m execMessage, timeout time.Duration) (execMessage, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.roundTrip(ctx, m, timeout)
}

// roundTrip is call with e.mu held. An executor that does not answer in
// time is killed: its state is unknown, and a role must not wait on it.
func (e *Executor) roundTrip(ctx context.Context, m execMessage, timeout time.Duration) (execMessage, error) {
	if err := e.Err(); err != nil {
		return execMessage{}, err
	}
	deadline := time.Now().Add(timeout)
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	b, err := encodeFrame(m)
	if err != nil {
		return execMessage{}, err
	}
	_ = e.conn.SetDeadline(deadline)
	stop := context.AfterFunc(ctx, func() { _ = e.conn.SetDeadline(time.Now()) })
	defer stop()
	if _, err = e.conn.Write(b); err == nil {
		var body []byte
		if body, err = readFrame(e.conn); err == nil {
			var reply execMessage
			if err := json.Unmarshal(body, &reply); err != nil {
				e.kill()
				return execMessage{}, fmt.Errorf("%w: %w: %w", ErrExecutorGone, ErrProtocol, err)
			}
			if reply.Op == "error" {
				return execMessage{}, &ExecutorError{Kind: reply.Kind, Msg: reply.Error}
			}
			return reply, nil
		}
	}
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		e.goneMu.Lock()
		if e.gone == nil {
			why := fmt.Sprintf("no answer to %s within %v: it hangs", m.Op, timeout)
			if ctx.Err() != nil {
				why = fmt.Sprintf("%s interrupted (%v)", m.Op, ctx.Err())
			}
			e.gone = fmt.Errorf("%w: %s; killed%s", ErrExecutorGone, why, e.log.describe())
		}
		e.goneMu.Unlock()
		e.kill()
	}
	<-e.doneOrNow()
	if gone := e.Err(); gone != nil {
		return execMessage{}, gone
	}
	return execMessage{}, fmt.Errorf("%w: %w", ErrExecutorGone, err)
}

// doneOrNow waits briefly for the process to be reaped after a failed
// call, so that the error names the exit status.
func (e *Executor) doneOrNow() <-chan struct{} {
	select {
	case <-e.done:
		return e.done
	case <-time.After(2 * time.Second):
		e.kill()
		return e.done
	}
}

// Build creates the module of uid: the user's function called with hidden,
// torch's generator seeded from seed and uid. It returns the module's
// number of parameters.
func (e *Executor) Build(ctx context.Context, uid string, hidden int, seed uint64) (int64, error) {
	reply, err := e.call(ctx, execMessage{Op: "build", UID: uid, Hidden: hidden, Seed: seed}, e.cfg.StartTimeout)
	if err != nil {
		return 0, err
	}
	n, err := CheckParams(reply.Params, math.MaxInt32)
	if err != nil {
		return 0, fmt.Errorf("bridge: executor: module of %s: %w", uid, err)
	}
	for _, p := range reply.Params {
		size := 1
		for _, d := range p.Shape {
			size *= d
		}
		if size > e.cfg.Elements {
			return 0, fmt.Errorf("bridge: executor: module of %s: parameter %s of %d elements does not fit the shared memory of %d, through which checkpoints pass", uid, p.Name, size, e.cfg.Elements)
		}
	}
	return int64(n), nil
}

// put writes t's elements into the region at element off.
func (e *Executor) put(off int, t *tensor.Tensor) {
	copy(e.region.floats(off, t.Len()), t.Data)
}

// fits checks that tensors of these element counts fit the region side
// by side.
func (e *Executor) fits(counts ...int) error {
	total := 0
	for _, n := range counts {
		total += n
	}
	if total > e.cfg.Elements {
		return &ExecutorError{Kind: "config", Msg: fmt.Sprintf("a call of %d elements does not fit the shared memory of %d", total, e.cfg.Elements)}
	}
	return nil
}

// output reads a call's result at off, which must have the shape want.
func (e *Executor) output(reply execMessage, off int, want []int) (*tensor.Tensor, error) {
	if !tensor.SameShape(reply.Shape, want) {
		return nil, &ExecutorError{Kind: "module", Msg: fmt.Sprintf("the module returned shape %v for an input of shape %v", reply.Shape, want)}
	}
	out := tensor.New(want...)
	copy(out.Data, e.region.floats(off, out.Len()))
	return out, nil
}

func (e *Executor) account(start time.Time, reply execMessage) {
	e.stats.Calls++
	e.stats.Seconds += time.Since(start).Seconds()
	e.stats.ComputeSeconds += max(0, reply.Seconds)
	e.stats.Memory = max(e.stats.Memory, reply.Memory)
}

// Forward returns the output of uid's module on x.
func (e *Executor) Forward(ctx context.Context, uid string, x *tensor.Tensor) (*tensor.Tensor, error) {
	n := x.Len()
	if err := e.fits(n, n); err != nil {
		return nil, err
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	start := time.Now()
	e.put(0, x)
	reply, err := e.roundTrip(ctx, execMessage{Op: "forward", UID: uid, Shape: x.Shape, X: 0, Out: n}, e.cfg.CallTimeout)
	if err != nil {
		return nil, err
	}
	y, err := e.output(reply, n, x.Shape)
	e.account(start, reply)
	return y, err
}

// Backward recomputes uid's forward pass on x, backpropagates dy and
// returns the gradient with respect to x; the parameters' gradients
// accumulate (zero: start afresh). With step > 0 the mean of the last
// step batches' gradients is clipped to clip (0: not clipped) and applied
// by the module's optimizer, unless it is not finite. It returns dx, the
// gradient norm before clipping (NaN without a step or when the step was
// skipped) and whether the step was taken.
func (e *Executor) Backward(ctx context.Context, uid string, x, dy *tensor.Tensor, zero bool, step int, clip float64) (dx *tensor.Tensor, norm float64, stepped bool, err error) {
	n := x.Len()
	if !tensor.SameShape(x.Shape, dy.Shape) {
		return nil, math.NaN(), false, fmt.Errorf("bridge: executor: dy of shape %v for x of shape %v", dy.Shape, x.Shape)
	}
	if err := e.fits(n, n, n); err != nil {
		return nil, math.NaN(), false, err
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	start := time.Now()
	e.put(0, x)
	e.put(n, dy)
	reply, err := e.roundTrip(ctx, execMessage{
		Op: "backward", UID: uid, Shape: x.Shape, X: 0, DY: n, Out: 2 * n,
		Zero: zero, Step: step, Clip: clip,
	}, e.cfg.CallTimeout)
	if err != nil {
		return nil, math.NaN(), false, err
	}
	if dx, err = e.output(reply, 2*n, x.Shape); err != nil {
		e.account(start, reply)
		return nil, math.NaN(), false, err
	}
	e.account(start, reply)
	norm = math.NaN()
	if reply.Norm != nil {
		norm = *reply.Norm
	}
	return dx, norm, reply.Stepped, nil
}

// State returns uid's parameters and its optimizer's moments by name (the
// moments as "opt/<parameter>.exp_avg" and ".exp_avg_sq") and its step
// counter, copied through the shared memory one tensor at a time.
func (e *Executor) State(ctx context.Context, uid string) (map[string]*tensor.Tensor, int64, error) {
	reply, err := e.call(ctx, execMessage{Op: "state", UID: uid}, e.cfg.CallTimeout)
	if err != nil {
		return nil, 0, err
	}
	if _, err := CheckParams(reply.Tensors, 3*e.cfg.Elements); err != nil {
		return nil, 0, fmt.Errorf("bridge: executor: state of %s: %w", uid, err)
	}
	out := make(map[string]*tensor.Tensor, len(reply.Tensors))
	for _, ts := range reply.Tensors {
		t := tensor.New(ts.Shape...)
		if err := e.fits(t.Len()); err != nil {
			return nil, 0, fmt.Errorf("bridge: executor: tensor %s of %s: %w", ts.Name, uid, err)
		}
		e.mu.Lock()
		r, err := e.roundTrip(ctx, execMessage{Op: "read", UID: uid, Name: ts.Name, At: 0}, e.cfg.CallTimeout)
		if err == nil {
			if !tensor.SameShape(r.Shape, ts.Shape) {
				err = &ExecutorError{Kind: "protocol", Msg: fmt.Sprintf("tensor %s of %s: shape %v, announced %v", ts.Name, uid, r.Shape, ts.Shape)}
			} else {
				copy(t.Data, e.region.floats(0, t.Len()))
			}
		}
		e.mu.Unlock()
		if err != nil {
			return nil, 0, err
		}
		out[ts.Name] = t
	}
	return out, int64(reply.Step), nil
}

// Load sets uid's parameters and optimizer moments from tensors (named as
// State names them) and its step counter. Every tensor of the module must
// be given, with its shape; a missing one is an error before anything is
// written.
func (e *Executor) Load(ctx context.Context, uid string, tensors map[string]*tensor.Tensor, step int64) error {
	reply, err := e.call(ctx, execMessage{Op: "state", UID: uid}, e.cfg.CallTimeout)
	if err != nil {
		return err
	}
	for _, ts := range reply.Tensors {
		t := tensors[ts.Name]
		if t == nil {
			return &ExecutorError{Kind: "config", Msg: fmt.Sprintf("expert %s: no tensor %s to load", uid, ts.Name)}
		}
		if !tensor.SameShape(t.Shape, ts.Shape) {
			return &ExecutorError{Kind: "config", Msg: fmt.Sprintf("expert %s: tensor %s has shape %v, the module's is %v", uid, ts.Name, t.Shape, ts.Shape)}
		}
		if err := e.fits(t.Len()); err != nil {
			return err
		}
	}
	for _, ts := range reply.Tensors {
		t := tensors[ts.Name]
		e.mu.Lock()
		e.put(0, t)
		_, err := e.roundTrip(ctx, execMessage{Op: "write", UID: uid, Name: ts.Name, Shape: t.Shape, At: 0, Step: int(step)}, e.cfg.CallTimeout)
		e.mu.Unlock()
		if err != nil {
			return err
		}
	}
	return nil
}

// tail keeps the last max bytes written to it, and passes them on to w.
type tail struct {
	mu  sync.Mutex
	max int
	buf []byte
	w   io.Writer
}

func (t *tail) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.w != nil {
		_, _ = t.w.Write(p)
	}
	t.buf = append(t.buf, p...)
	if over := len(t.buf) - t.max; over > 0 {
		t.buf = append(t.buf[:0], t.buf[over:]...)
	}
	return len(p), nil
}

func (t *tail) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return string(t.buf)
}

// describe is the end of the executor's output, for error messages.
func (t *tail) describe() string {
	s := strings.TrimSpace(t.String())
	if s == "" {
		return ""
	}
	lines := bytes.Split([]byte(s), []byte("\n"))
	if len(lines) > 12 {
		lines = lines[len(lines)-12:]
	}
	return "; its last output:\n" + string(bytes.Join(lines, []byte("\n")))
}
