package pipeline

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"slices"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/skyhive/skyhive/nn"
	"github.com/skyhive/skyhive/tensor"
)

// onActs receives a neighbour's stream of activations or gradients (a
// sequence of length-prefixed act messages) and queues each in the inbox.
// The sender must be the current plan's neighbour stage in the direction
// it sends: anyone else is refused before a byte is read. Each message's
// length is checked against what one micro-batch of the stage's real
// shape takes before anything is allocated, and its buffer grows as the
// bytes arrive; the host's idle timeout cuts off a sender that stalls.
func (w *Worker) onActs(ctx context.Context, from peer.ID, r io.Reader, _ io.Writer) error {
	src, err := w.actSource(from)
	if err != nil {
		return err
	}
	var hdr [4]byte
	for {
		if _, err := io.ReadFull(r, hdr[:]); err != nil {
			if errors.Is(err, io.EOF) {
				return nil
			}
			return err
		}
		n := binary.BigEndian.Uint32(hdr[:])
		if int64(n) > src.frame {
			err := fmt.Errorf("%w: activation message of %d bytes, at most %d for this stage", errMsg, n, src.frame)
			w.failIter(src.gen, err)
			return err
		}
		b, err := readFrame(r, int(n))
		if err != nil {
			return err
		}
		if err := w.onAct(from, b); err != nil {
			return err
		}
		if err := ctx.Err(); err != nil {
			return err
		}
	}
}

// actSrc is what a worker accepts from one neighbour: the direction it
// sends, the generation and inbox of the current plan and the size bounds
// of its messages.
type actSrc struct {
	backward bool
	gen      uint64
	box      *inbox
	frame    int64 // bytes of one message, length prefix excluded
}

// actSource checks that from is a neighbour stage of the current plan and
// returns what the worker accepts from it.
func (w *Worker) actSource(from peer.ID) (actSrc, error) {
	w.mu.Lock()
	src := actSrc{gen: w.gen, box: w.box}
	prev, next := w.prev, w.next
	w.mu.Unlock()
	switch {
	case from == "":
		return actSrc{}, errors.New("pipeline: activation from an unknown peer")
	case from == prev:
	case from == next:
		src.backward = true
	default:
		return actSrc{}, fmt.Errorf("pipeline: %s is not a neighbour stage of this worker", from.ShortString())
	}
	src.frame = src.box.frameBytes(src.backward)
	if src.frame <= 0 {
		return actSrc{}, errors.New("pipeline: no stage to receive activations")
	}
	return src, nil
}

// readFrame reads exactly n bytes, growing its buffer as data arrives, so
// a length prefix alone costs little.
func readFrame(r io.Reader, n int) ([]byte, error) {
	const first = 64 << 10
	buf := make([]byte, 0, min(n, first))
	for len(buf) < n {
		if len(buf) == cap(buf) {
			buf = slices.Grow(buf, min(3*cap(buf), n-len(buf)))
		}
		k, err := r.Read(buf[len(buf):cap(buf)])
		buf = buf[:len(buf)+k]
		if err != nil && len(buf) < n {
			if errors.Is(err, io.EOF) {
				err = io.ErrUnexpectedEOF
			}
			return nil, err
		}
	}
	return buf, nil
}

// onAct queues one activation or gradient from a neighbour. The sender is
// checked before the message is decoded; a tensor of the wrong shape or
// with NaN or Inf values is refused and fails the iteration waiting for
// it, which the coordinator handles as a failed stage.
func (w *Worker) onAct(from peer.ID, b []byte) error {
	src, err := w.actSource(from)
	if err != nil {
		return err
	}
	if int64(len(b)) > src.frame {
		return fmt.Errorf("%w: activation message of %d bytes, at most %d for this stage", errMsg, len(b), src.frame)
	}
	var m actMsg
	ts, err := decodeMsg(b, &m, src.box.limits(src.backward))
	if err == nil && (len(ts) != 1 || ts[0].Name != "t") {
		err = fmt.Errorf("%w: want one tensor \"t\"", errMsg)
	}
	if err != nil {
		w.failIter(src.gen, err)
		return err
	}
	switch {
	case m.Gen != src.gen:
		return fmt.Errorf("pipeline: activation of generation %d, current %d", m.Gen, src.gen)
	case m.Backward != src.backward:
		return fmt.Errorf("pipeline: unexpected %s activation from %s", direction(m.Backward), from.ShortString())
	}
	err = src.box.put(actKey{iter: m.Iter, micro: m.Micro, backward: m.Backward}, ts[0].Tensor)
	if errors.Is(err, errBadAct) {
		w.failIter(src.gen, fmt.Errorf("%s from %s: %w", direction(m.Backward), from.ShortString(), err))
	}
	return err
}

func direction(backward bool) string {
	if backward {
		return "backward"
	}
	return "forward"
}

// failIter stops the running iteration of generation gen, if any, with
// err as its cause.
func (w *Worker) failIter(gen uint64, err error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.gen == gen && w.cancelIter != nil {
		w.cancelIter(err)
	}
}

// onIter runs one iteration of the current stage.
func (w *Worker) onIter(ctx context.Context, b []byte) ([]byte, error) {
	var req iterReq
	ts, err := decodeMsg(b, &req, bulkLimits)
	if err != nil {
		return nil, err
	}
	w.runMu.Lock()
	defer w.runMu.Unlock()
	st := w.st
	if st == nil || st.req.Gen != req.Gen {
		return nil, fmt.Errorf("pipeline: iteration of generation %d, worker has no stage of it", req.Gen)
	}
	if req.Iter != st.iter {
		return nil, fmt.Errorf("pipeline: iteration %d, worker expects %d", req.Iter, st.iter)
	}
	total := 0
	for _, n := range req.Sizes {
		if n < 1 || n > maxBatch {
			return nil, fmt.Errorf("pipeline: micro-batch of %d examples", n)
		}
		total += n
	}
	if len(req.Sizes) < 1 || len(req.Sizes) > maxMicro || total > maxBatch || req.Schedule.Micro(len(req.Sizes)) != len(req.Sizes) {
		return nil, fmt.Errorf("pipeline: bad micro-batch sizes (%d of them, %d examples, %s)", len(req.Sizes), total, req.Schedule)
	}
	in := namedMap(ts)
	var x *tensor.Tensor
	var y []int
	if st.first() {
		x = in["x"]
		if x == nil || !slices.Equal(x.Shape, append([]int{total}, st.in...)) {
			return nil, fmt.Errorf("pipeline: stage 0 needs inputs \"x\" of shape %v", append([]int{total}, st.in...))
		}
		if st.info.lm() {
			// The embedding would index out of its table.
			if err := st.info.checkTokens(x, nil, total); err != nil {
				return nil, err
			}
		}
	}
	if st.last() {
		if st.info.lm() {
			y, err = tokenLabels(st.info, in["y"], total)
		} else {
			y, err = labels(in["y"], total, st.out[len(st.out)-1])
		}
		if err != nil {
			return nil, err
		}
	}
	timeout := time.Duration(req.TimeoutMS) * time.Millisecond
	if timeout <= 0 || timeout > time.Hour {
		timeout = time.Hour
	}
	ictx, cancel := context.WithCancelCause(ctx)
	ictx, cancelT := context.WithTimeout(ictx, timeout)
	defer cancelT()
	w.mu.Lock()
	if w.gen != req.Gen || w.aborted == (abortReq{Gen: req.Gen, Iter: req.Iter}) {
		w.mu.Unlock()
		cancel(nil)
		return nil, errors.New("pipeline: iteration aborted or re-planned before it started")
	}
	w.cancelIter = cancel
	box := w.box
	w.mu.Unlock()
	defer func() {
		w.mu.Lock()
		w.cancelIter = nil
		w.mu.Unlock()
		cancel(nil)
	}()
	resp, err := w.runIter(ictx, st, box, req, x, y)
	if w.m != nil {
		w.m.iteration(st.req.Stage, resp, err)
	}
	box.done(req.Iter)
	if err != nil {
		_ = st.discard(ctx) // the executor's error, if any, is the next call's
		if cause := context.Cause(ictx); cause != nil && !errors.Is(err, cause) {
			err = fmt.Errorf("%w (%w)", err, cause)
		}
		return nil, fmt.Errorf("pipeline: stage %d iteration %d: %w", st.req.Stage, req.Iter, err)
	}
	st.ready = req.Iter
	return encodeMsg(resp, nil)
}

// labels checks a float32 label tensor and converts it.
func labels(t *tensor.Tensor, n, classes int) ([]int, error) {
	if t == nil || !slices.Equal(t.Shape, []int{n}) {
		return nil, fmt.Errorf("pipeline: last stage needs labels \"y\" of shape [%d]", n)
	}
	y := make([]int, n)
	for i, v := range t.Data {
		if v != float32(int(v)) || v < 0 || int(v) >= classes {
			return nil, fmt.Errorf("pipeline: label %v not an integer in [0,%d)", v, classes)
		}
		y[i] = int(v)
	}
	return y, nil
}

// tokenLabels checks a language model's [n, Seq] float32 labels and
// converts them.
func tokenLabels(info ModelInfo, t *tensor.Tensor, n int) ([]int, error) {
	if t == nil {
		return nil, fmt.Errorf("pipeline: last stage needs labels \"y\" of shape [%d %d]", n, info.Labels)
	}
	if err := info.checkTokens(nil, t, n); err != nil {
		return nil, err
	}
	y := make([]int, len(t.Data))
	for i, v := range t.Data {
		y[i] = int(v)
	}
	return y, nil
}

// runIter executes the schedule's ops for one iteration.
func (w *Worker) runIter(ctx context.Context, st *stage, box *inbox, req iterReq, x *tensor.Tensor, y []int) (iterResp, error) {
	start := time.Now()
	ctx, fail := context.WithCancelCause(ctx)
	defer fail(nil)
	// An uncommitted earlier iteration is discarded.
	if err := st.discard(ctx); err != nil {
		return iterResp{}, err
	}
	var spread opSpread
	m := len(req.Sizes)
	it := &iterRun{st: st, req: req, x: x, y: y, offs: make([]int, m+1),
		states: make([]nn.State, m), dlogits: make([]*tensor.Tensor, m)}
	for i, n := range req.Sizes {
		it.offs[i+1] = it.offs[i] + n
		it.total += n
	}
	var fwd, bwd actSender
	if !st.last() {
		fwd = w.dial(ctx, st.next, req, false, m, fail)
	}
	if !st.first() {
		bwd = w.dial(ctx, st.prev, req, true, m, fail)
	}
	var compute, idle, busy time.Duration
	var opErr error
	for _, op := range Ops(req.Schedule, st.req.Stage, st.req.Stages, m) {
		n := req.Sizes[op.Micro]
		in, waited, err := it.input(ctx, box, op)
		idle += waited
		if err != nil {
			opErr = err
			break
		}
		t0 := time.Now()
		clk := startOp()
		result, execBusy, err := it.run(ctx, op, in)
		wl, b := clk.stop()
		if err != nil {
			opErr = fmt.Errorf("%v: %w", op, err)
			break
		}
		if st.exec != nil {
			b = execBusy
		}
		b = w.emulatedBusy(opKey{work: st.work(), backward: op.Backward, n: n}, b, st.cold())
		busy += b
		// The emulated device finishes the op, then its result leaves.
		w.throttle(ctx, wl, b)
		d := time.Since(t0)
		compute += d
		spread.add(opKind{backward: op.Backward, n: n}, d.Seconds())
		switch {
		case !op.Backward && !st.last():
			fwd.send(op.Micro, result)
		case op.Backward && !st.first():
			bwd.send(op.Micro, result)
		}
		if err := ctx.Err(); err != nil {
			opErr = context.Cause(ctx)
			break
		}
	}
	var comm time.Duration
	for _, s := range []actSender{fwd, bwd} {
		if s == nil {
			continue
		}
		d, err := s.finish()
		comm += d
		if opErr == nil && err != nil {
			opErr = err
		}
	}
	if opErr != nil {
		return iterResp{}, opErr
	}
	resp := it.resp
	if st.exec != nil {
		sq, err := st.exec.StageGradSq(execCtx(ctx), execStage)
		if err != nil {
			return iterResp{}, err
		}
		resp.GradSq = sq
	}
	for _, p := range st.params {
		resp.GradSq += tensor.SumSquares(p.Grad.Data)
	}
	resp.Compute, resp.Idle, resp.Comm, resp.CPU = compute.Seconds(), idle.Seconds(), comm.Seconds(), busy.Seconds()
	resp.OpCV = spread.cv()
	resp.Wall = time.Since(start).Seconds()
	return resp, nil
}

// iterRun is one stage's state through one iteration: its inputs, the
// micro-batches' offsets into them, the forward states kept for the
// backward ops, the last stage's loss gradients, and the loss so far.
type iterRun struct {
	st      *stage
	req     iterReq
	x       *tensor.Tensor
	y       []int
	offs    []int // micro-batch i is examples offs[i]:offs[i+1]
	total   int   // examples in the iteration
	states  []nn.State
	dlogits []*tensor.Tensor
	resp    iterResp // Loss and Correct accumulate here
}

// input returns op's input: the first stage's rows of x, the last
// stage's loss gradient, or else the activation or gradient received
// from the neighbouring stage, with the time spent waiting for it.
func (it *iterRun) input(ctx context.Context, box *inbox, op Op) (*tensor.Tensor, time.Duration, error) {
	st := it.st
	switch {
	case !op.Backward && st.first():
		return rows(it.x, it.offs[op.Micro], it.offs[op.Micro+1]), 0, nil
	case op.Backward && st.last():
		return it.dlogits[op.Micro], 0, nil
	}
	n := it.req.Sizes[op.Micro]
	t0 := time.Now()
	t, err := box.get(ctx, actKey{iter: it.req.Iter, micro: op.Micro, backward: op.Backward})
	idle := time.Since(t0)
	if err != nil {
		return nil, idle, fmt.Errorf("waiting for %v: %w", op, err)
	}
	shape := st.in
	if op.Backward {
		shape = st.out
	}
	if !slices.Equal(t.Shape, append([]int{n}, shape...)) {
		return nil, idle, fmt.Errorf("%v: tensor of shape %v, want %v", op, t.Shape, append([]int{n}, shape...))
	}
	return t, idle, nil
}

// run computes op on in and returns its result: the forward output
// (whose loss the last stage also takes) or the input gradient, and for a
// stage in the executor the busy time it measured.
func (it *iterRun) run(ctx context.Context, op Op, in *tensor.Tensor) (*tensor.Tensor, time.Duration, error) {
	st := it.st
	if st.exec != nil {
		return it.runExec(ctx, op, in)
	}
	if op.Backward {
		result := st.model.Backward(it.states[op.Micro], in)
		it.states[op.Micro], it.dlogits[op.Micro] = nil, nil
		return result, 0, nil
	}
	out, s := st.model.Forward(nn.Ctx{Train: true}, in)
	it.states[op.Micro] = s
	if st.last() {
		it.loss(op, out)
	}
	return out, 0, nil
}

// loss adds micro-batch op.Micro's share of the loss and its correct
// predictions to the response and keeps its loss gradient for the
// backward op.
func (it *iterRun) loss(op Op, out *tensor.Tensor) {
	st := it.st
	n := it.req.Sizes[op.Micro]
	// Labels per example: 1 for an image, Seq for text.
	per := st.info.Labels
	ym := it.y[it.offs[op.Micro]*per : it.offs[op.Micro+1]*per]
	var loss float32
	var dl *tensor.Tensor
	preds := out
	if st.info.lm() {
		loss, dl = nn.SequenceCrossEntropy(out, ym)
		preds = out.Reshape(n*per, out.Shape[len(out.Shape)-1])
	} else {
		loss, dl = nn.SoftmaxCrossEntropy(out, ym)
	}
	wgt := float32(n) / float32(it.total)
	tensor.Scale(wgt, dl.Data)
	it.dlogits[op.Micro] = dl
	it.resp.Loss += float64(loss) * float64(wgt)
	for i, p := range nn.Argmax(preds) {
		if p == ym[i] {
			it.resp.Correct++
		}
	}
}

// rows returns rows [lo, hi) of x, sharing its memory.
func rows(x *tensor.Tensor, lo, hi int) *tensor.Tensor {
	per := x.Len() / x.Shape[0]
	shape := append([]int{hi - lo}, x.Shape[1:]...)
	return tensor.FromSlice(x.Data[lo*per:hi*per], shape...)
}
