package server

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/skyhive/skyhive/tensor"
)

// task is one request waiting in a pool.
type task struct {
	ctx   context.Context
	x, dy *tensor.Tensor
	enq   time.Time
	done  chan result // buffered, capacity 1
	// bytes is the size of x and dy, counted against Config.QueueMemory
	// until the task leaves the runtime; work is the working memory its
	// rows add to a batch (see workBytes).
	bytes, work int64
}

type result struct {
	out *tensor.Tensor
	err error
}

// pool queues the forward or the backward requests of one expert.
type pool struct {
	expert   *expert
	backward bool
	tasks    []*task
	rows     int
}

// runtime schedules batches across all pools: a pool is ready when it holds
// at least MinBatch rows or its oldest request has waited BatchTimeout;
// among ready pools whose expert is idle, the one with the oldest request
// runs next (hivemind's oldest-first priority). Each worker processes one
// batch at a time; an expert runs at most one batch at a time.
type runtime struct {
	cfg  *Config
	mu   sync.Mutex
	busy map[*expert]bool
	// queued lists pools with at least one task.
	queued []*pool
	// queuedBytes sums the bytes of the tasks queued or running.
	queuedBytes int64
	closed      bool
	wake        chan struct{}
	m           *serverMetrics // nil without Config.Metrics
}

var errClosed = errors.New("moe/server: server closed")
var errQueueFull = errors.New("moe/server: queue full")

// errBusy reports a request refused because the tensors of the requests
// already queued or running fill Config.QueueMemory.
var errBusy = errors.New("moe/server: server busy")

func newRuntime(cfg *Config) *runtime {
	return &runtime{cfg: cfg, busy: map[*expert]bool{}, wake: make(chan struct{}, 1)}
}

func (r *runtime) signal() {
	select {
	case r.wake <- struct{}{}:
	default:
	}
}

// submit queues a request whose rows need work bytes of working memory
// and waits for its result or ctx.
func (r *runtime) submit(ctx context.Context, p *pool, x, dy *tensor.Tensor, work int64) (*tensor.Tensor, error) {
	t := &task{ctx: ctx, x: x, dy: dy, enq: time.Now(), done: make(chan result, 1), bytes: 4 * int64(x.Len()), work: work}
	if dy != nil {
		t.bytes += 4 * int64(dy.Len())
	}
	r.mu.Lock()
	if r.closed {
		r.mu.Unlock()
		return nil, errClosed
	}
	if len(p.tasks) >= r.cfg.MaxQueue {
		r.mu.Unlock()
		return nil, fmt.Errorf("%w: %d requests waiting for %s", errQueueFull, len(p.tasks), p.expert.uid)
	}
	if r.queuedBytes+t.bytes > r.cfg.QueueMemory {
		held := r.queuedBytes
		r.mu.Unlock()
		return nil, fmt.Errorf("%w: requests queued or running hold %d bytes, %d more would exceed the budget of %d", errBusy, held, t.bytes, r.cfg.QueueMemory)
	}
	r.queuedBytes += t.bytes
	if len(p.tasks) == 0 {
		r.queued = append(r.queued, p)
	}
	p.tasks = append(p.tasks, t)
	p.rows += x.Shape[0]
	r.mu.Unlock()
	r.signal()
	select {
	case res := <-t.done:
		return res.out, res.err
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// next picks the pool to run and removes its batch, or returns how long to
// wait before a pool becomes ready. The caller holds r.mu.
func (r *runtime) next(now time.Time) (*pool, []*task, time.Duration) {
	var best *pool
	wait := time.Duration(-1)
	for _, p := range r.queued {
		if r.busy[p.expert] {
			continue
		}
		age := now.Sub(p.tasks[0].enq)
		if p.rows < r.cfg.MinBatch && age < r.cfg.BatchTimeout {
			if w := r.cfg.BatchTimeout - age; wait < 0 || w < wait {
				wait = w
			}
			continue
		}
		if best == nil || p.tasks[0].enq.Before(best.tasks[0].enq) {
			best = p
		}
	}
	if best == nil {
		return nil, nil, wait
	}
	// Take tasks oldest first up to MaxBatch rows and RequestMemory bytes
	// of working memory; a transformer batch needs one sequence length, so
	// later tasks of another shape wait.
	shape := best.tasks[0].x.Shape[1:]
	var batch []*task
	rows := 0
	var work int64
	rest := best.tasks[:0:0]
	for _, t := range best.tasks {
		n := t.x.Shape[0]
		if t.ctx.Err() != nil {
			best.rows -= n
			r.queuedBytes -= t.bytes
			continue // the caller is gone
		}
		if (len(batch) == 0 || (rows+n <= r.cfg.MaxBatch && work+t.work <= r.cfg.RequestMemory)) && slices.Equal(t.x.Shape[1:], shape) {
			batch = append(batch, t)
			rows += n
			work += t.work
			best.rows -= n
			continue
		}
		rest = append(rest, t)
	}
	best.tasks = rest
	if len(rest) == 0 {
		r.queued = slices.DeleteFunc(r.queued, func(p *pool) bool { return p == best })
	}
	if len(batch) == 0 {
		return nil, nil, 0
	}
	r.busy[best.expert] = true
	return best, batch, 0
}

// work runs batches until ctx ends.
func (r *runtime) work(ctx context.Context) {
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		r.mu.Lock()
		p, batch, wait := r.next(time.Now())
		r.mu.Unlock()
		if p != nil {
			r.process(p, batch)
			r.mu.Lock()
			delete(r.busy, p.expert)
			r.mu.Unlock()
			r.signal()
			continue
		}
		if wait == 0 {
			continue
		}
		if wait < 0 {
			wait = time.Hour
		}
		timer.Reset(wait)
		select {
		case <-ctx.Done():
			return
		case <-r.wake:
		case <-timer.C:
		}
		if !timer.Stop() {
			select {
			case <-timer.C:
			default:
			}
		}
	}
}

// close fails every queued request.
func (r *runtime) close() {
	r.mu.Lock()
	r.closed = true
	queued := r.queued
	r.queued = nil
	for _, p := range queued {
		for _, t := range p.tasks {
			r.queuedBytes -= t.bytes
		}
	}
	r.mu.Unlock()
	for _, p := range queued {
		for _, t := range p.tasks {
			t.done <- result{err: errClosed}
		}
		p.tasks, p.rows = nil, 0
	}
}

// process runs one batch on the expert and answers its tasks.
func (r *runtime) process(p *pool, batch []*task) {
	e := p.expert
	rows := 0
	for _, t := range batch {
		rows += t.x.Shape[0]
	}
	x := concatRows(batch, func(t *task) *tensor.Tensor { return t.x }, rows)
	var dy *tensor.Tensor
	if p.backward {
		dy = concatRows(batch, func(t *task) *tensor.Tensor { return t.dy }, rows)
	}
	start := time.Now()
	out, oc, err := r.run(e, p.backward, x, dy)
	end := time.Now()
	// The inputs are no longer needed: release their budget before the
	// callers hear back, so that their next requests find it free.
	r.mu.Lock()
	for _, t := range batch {
		r.queuedBytes -= t.bytes
	}
	r.mu.Unlock()
	if err != nil {
		for _, t := range batch {
			t.done <- result{err: err}
			e.recordError(p.backward)
		}
		return
	}
	// Stats and the log are written before the callers hear back, so a
	// caller that reads them after its answer sees its own batch.
	var latency time.Duration
	results := make([]result, len(batch))
	off := 0
	answered := 0
	for i, t := range batch {
		n := t.x.Shape[0]
		per := out.Len() / rows
		data := out.Data[off*per : (off+n)*per]
		off += n
		latency += end.Sub(t.enq)
		if !allFinite(data) {
			// Never hand a caller NaN or Inf: with validated inputs and
			// finite weights this does not happen, but if it does the
			// caller sees a failed expert instead of a poisoned answer.
			results[i] = result{err: fmt.Errorf("expert %s: %w", e.uid, errNonFiniteOutput)}
			e.recordError(p.backward)
			continue
		}
		o := tensor.New(append([]int{n}, out.Shape[1:]...)...)
		copy(o.Data, data)
		results[i] = result{out: o}
		answered++
	}
	skipped := e.record(p.backward, oc, answered, rows, latency, end.Sub(start))
	if r.m != nil {
		r.m.batch(p.backward, rows, batch, end)
	}
	if oc.skipped && skipped&(skipped-1) == 0 {
		// Logged at the 1st, 2nd, 4th, 8th… skip, so a stream of bad
		// gradients cannot flood the log; the count is in the stats.
		r.cfg.Logger.Warn("expert step skipped: gradients not finite; weights unchanged",
			"expert", e.uid, "norm", oc.norm, "rows", rows, "requests", len(batch), "skipped_total", skipped)
	}
	for i, t := range batch {
		t.done <- results[i]
	}
}

// run executes the expert, turning a panic of the tensor code (a shape the
// validation missed) into an error so the server keeps serving.
func (r *runtime) run(e *expert, backward bool, x, dy *tensor.Tensor) (out *tensor.Tensor, oc outcome, err error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	defer func() {
		if p := recover(); p != nil {
			out, oc, err = nil, outcome{}, fmt.Errorf("expert %s failed: %v", e.uid, p)
			// Drop gradients a failed backward may have half accumulated.
			e.pendingRows, e.pendingBatches = 0, 0
		}
	}()
	if e.cfg.Executor != nil {
		return e.runExecutor(backward, x, dy)
	}
	if backward {
		out, oc = e.backward(x, dy)
		return out, oc, nil
	}
	return e.forward(x), outcome{}, nil
}

func concatRows(batch []*task, get func(*task) *tensor.Tensor, rows int) *tensor.Tensor {
	first := get(batch[0])
	if len(batch) == 1 {
		return first
	}
	shape := append([]int{rows}, first.Shape[1:]...)
	out := tensor.New(shape...)
	off := 0
	for _, t := range batch {
		off += copy(out.Data[off:], get(t).Data)
	}
	return out
}
