// Package optimizer is the training integration of group averaging, in the
// spirit of hivemind.Optimizer: it wraps any optim.Optimizer, and the
// caller's own training loop calls Step after computing its gradients. The
// wrapper decides when and with whom to average, over an averaging.Averager:
//
//   - WAGMA: wait-avoiding butterfly groups that change every round, the
//     first peer to arrive triggers its group, and a synchronous global
//     average every Tau rounds bounds staleness (fixed ranks, wagma.go), or
//     Moshpit-style groups formed through the DHT every wall-clock round
//     (no ranks; peers may join and leave; match.go);
//   - all-reduce SGD: every step, gradients (or models) averaged with all
//     (allreduce.go);
//   - local SGD: models averaged with all every Period steps (local.go);
//   - DiLoCo: InnerSteps steps of the wrapped optimizer alone, then the
//     pseudo-gradients are averaged with all and an outer Nesterov step is
//     taken (diloco.go), optionally one parameter fragment at a time with
//     the all-reduces overlapping the inner steps (streaming.go);
//   - WA-DiLoCo: DiLoCo whose outer steps average in WAGMA's butterfly
//     groups, with a synchronous global outer step every Tau outer steps
//     (wadiloco.go).
//
// The Optimizer is a driver over the algorithm (algorithm.go): it owns the
// parameters, the wrapped optimizer, the averager, the fixed roster's
// rounds (ranks.go), statistics and metrics, and the lock. It also serves
// its model and optimizer state to peers that join late (serve.go; Join
// downloads it from several donors and cross-checks them, download.go),
// and publishes the swarm's progress in the DHT (progress.go).
package optimizer

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"slices"
	"sync"
	"time"

	"github.com/skyhive/skyhive/averaging"
	"github.com/skyhive/skyhive/nn"
	"github.com/skyhive/skyhive/optim"
	"github.com/skyhive/skyhive/tensor"
)

// Optimizer wraps an optim.Optimizer and averages its parameters with other
// peers as its algorithm says. The caller computes gradients and calls Step;
// the Optimizer owns the parameters' values only inside Step (background
// averaging results are applied at the next Step). Close stops it.
type Optimizer struct {
	cfg    Config
	avg    *averaging.Averager
	inner  optim.Optimizer
	params []*nn.Param
	n      int
	layout Layout
	alg    algorithm
	ranks  *ranks                // MatchRanks only
	mm     *averaging.Matchmaker // MatchDHT only
	serve  *stateServer
	prog   *swarmProgress

	onGroup func(GroupInfo)

	bgCtx    context.Context
	cancelBG context.CancelFunc
	start    sync.Once
	bg       sync.WaitGroup
	flat     []float32 // Step's goroutine only

	mu        sync.Mutex
	closed    bool
	started   bool
	published []float32 // the model after the last Step
	delta     []float32 // averaging results not yet applied
	round     int       // round counter of the published model
	// syncs counts the global averages (WAGMA) and global outer steps
	// (WA-DiLoCo) applied: a group average or group outer step taken from
	// a snapshot before one is superseded by it and dropped.
	syncs int
	stats Stats

	m *optimizerMetrics // nil without Config.Metrics
}

// New returns an optimizer over avg's transport that steps inner; it
// registers the activation and state handlers there. Nothing runs in the
// background until the first Step.
func New(avg *averaging.Averager, inner optim.Optimizer, cfg Config) (*Optimizer, error) {
	if err := cfg.complete(avg.Transport().ID()); err != nil {
		return nil, err
	}
	params := inner.Params()
	n := 0
	for _, q := range params {
		n += q.Value.Len()
	}
	if n == 0 || n > avg.Config().MaxElements {
		return nil, fmt.Errorf("averaging: model of %d parameters", n)
	}
	ctx, cancel := context.WithCancel(context.Background())
	o := &Optimizer{
		cfg: cfg, avg: avg, inner: inner, params: params, n: n,
		bgCtx: ctx, cancelBG: cancel, flat: make([]float32, n),
		published: make([]float32, n), delta: make([]float32, n),
	}
	nn.FlatValues(params, o.published)
	o.stats.Rank = cfg.Rank
	if cfg.Matchmaking == averaging.MatchRanks {
		o.ranks = newRanks(o)
	}
	var err error
	if o.alg, err = newAlgorithm(o); err != nil {
		cancel()
		return nil, err
	}
	if g, ok := o.alg.(grouper); ok && o.ranks != nil {
		o.ranks.groups = g
	}
	o.layout = NewLayout(params, withBuffers(inner.State(), o.alg.buffers()))
	if o.cfg.Model == "" {
		o.cfg.Model = fmt.Sprintf("%d-params-%x", n, o.layout.Hash)
	}
	if cfg.Matchmaking == averaging.MatchDHT {
		o.mm = averaging.NewMatchmaker(cfg.DHT, avg.Transport(), averaging.MatchConfig{
			Run: o.cfg.RunID, Interval: cfg.RoundInterval, Window: cfg.MatchWindow,
			GroupSize: cfg.GroupSize, Dims: cfg.GridDims, Model: o.cfg.Model,
		})
	}
	o.serve = newStateServer(o.layout, o.cfg.MaxDownloads, o.exportServed)
	o.prog = &swarmProgress{tracker: progressTracker{target: cfg.TargetBatchSize}}
	if cfg.Metrics != nil {
		if o.m, err = newOptimizerMetrics(o, cfg.Metrics); err != nil {
			cancel()
			return nil, err
		}
	}
	avg.Transport().SetHandler(ActivateProtocol, o.handleActivate)
	avg.Transport().SetHandler(StateProtocol, o.serve.handle)
	return o, nil
}

// Inner returns the wrapped optimizer.
func (o *Optimizer) Inner() optim.Optimizer { return o.inner }

// ModelSignature is the signature peers of one run must share.
func (o *Optimizer) ModelSignature() string { return o.cfg.Model }

// Layout describes the state this optimizer serves and loads.
func (o *Optimizer) Layout() Layout { return o.layout }

// ZeroGrad clears the gradients of the wrapped optimizer's parameters.
func (o *Optimizer) ZeroGrad() { o.inner.ZeroGrad() }

// OnGroup sets a callback run after every MatchDHT group all-reduce (from
// the matchmaking goroutine). Set it before the first Step.
func (o *Optimizer) OnGroup(f func(GroupInfo)) { o.onGroup = f }

// Snapshot returns a copy of the model after the last Step, with averaging
// results that arrived since applied.
func (o *Optimizer) Snapshot() []float32 {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.snapshotLocked()
}

// Consensus returns a copy of the model this peer holds as the swarm's
// agreed one: for DiLoCo and WA-DiLoCo the outer parameters (the anchor,
// the result of the last outer step or, for WA-DiLoCo, group average,
// from which the inner steps move each replica away until the next), for
// the other algorithms Snapshot. It is the model to evaluate: DiLoCo's
// papers evaluate the outer model, not a replica in mid inner loop.
func (o *Optimizer) Consensus() []float32 {
	o.mu.Lock()
	defer o.mu.Unlock()
	if c := o.alg.consensusLocked(); c != nil {
		return c
	}
	return o.snapshotLocked()
}

func (o *Optimizer) snapshotLocked() []float32 {
	out := make([]float32, o.n)
	copy(out, o.published)
	tensor.Axpy(1, o.delta, out)
	return out
}

// Stats returns the statistics so far.
func (o *Optimizer) Stats() Stats {
	o.mu.Lock()
	defer o.mu.Unlock()
	s := o.stats
	if o.ranks != nil {
		s.Dead = len(o.ranks.dead)
	}
	return s
}

// Round returns the round counter of the model after the last Step.
func (o *Optimizer) Round() int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.round
}

// Close stops the background averaging and waits for it; later Steps fail.
func (o *Optimizer) Close() error {
	o.mu.Lock()
	o.closed = true
	o.mu.Unlock()
	if o.m != nil {
		o.m.reg.Unregister(o.m)
	}
	o.cancelBG()
	o.bg.Wait()
	return nil
}

// goLocked runs f in the background unless the optimizer is closed; o.mu
// must be held, so that Close cannot start waiting between the check and
// the Add. Every background work of the algorithms runs through it, so
// that Close stops (bgCtx) and waits for all of it.
func (o *Optimizer) goLocked(f func()) bool {
	if o.closed {
		return false
	}
	o.bg.Add(1)
	go func() {
		defer o.bg.Done()
		f()
	}()
	return true
}

// startBackground starts the algorithm's background work and the progress
// loop, once.
func (o *Optimizer) startBackground() {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.started = true
	o.alg.startLocked(o.bgCtx)
	if o.cfg.DHT != nil {
		p := progressPublisher{
			node: o.cfg.DHT, key: ProgressKey(o.cfg.RunID), self: o.avg.Transport().ID(),
			every: o.cfg.ProgressEvery, counters: o.counters, failed: o.progressFailed,
		}
		o.goLocked(func() { o.prog.run(o.bgCtx, p) })
	}
}

// counters returns the round counter and the local steps, for progress.
func (o *Optimizer) counters() (round, steps int) {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.round, o.stats.Steps
}

// progressFailed counts a failed publication or read of progress.
func (o *Optimizer) progressFailed() {
	o.mu.Lock()
	o.stats.MatchErrors++
	o.mu.Unlock()
}

// ErrClosed is returned by Step after Close.
var ErrClosed = errors.New("averaging: optimizer closed")

// Step applies the wrapped optimizer's step with the gradients the caller
// computed on samples examples, and averages as the algorithm says: for
// all-reduce SGD it first averages the gradients with every peer; for
// WAGMA it applies the group averages that arrived and joins (or
// activates) this round's group in the background, or the global average
// every Tau rounds; for local SGD it averages with every peer every Period
// steps; for DiLoCo it takes the outer step every InnerSteps steps. It
// returns ctx's error if ctx ended while it waited.
func (o *Optimizer) Step(ctx context.Context, samples int) error {
	o.start.Do(o.startBackground)
	o.mu.Lock()
	closed, round := o.closed, o.round
	o.mu.Unlock()
	if closed {
		return ErrClosed
	}
	return o.alg.step(ctx, samples, round)
}

// innerStep takes the wrapped optimizer's step, applies the averages that
// arrived meanwhile, publishes the model and makes round its round
// counter, in one critical section: a snapshot taken in between would
// miss the applied delta and count it twice, and state served to a joiner
// must match the optimizer's buffers.
func (o *Optimizer) innerStep(samples, round int) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.innerStepLocked(samples)
	o.round = round
	o.stats.Round = round
}

// innerStepLocked is innerStep without the round counter; o.mu must be
// held.
func (o *Optimizer) innerStepLocked(samples int) {
	o.inner.Step()
	o.applyDeltaLocked()
	nn.FlatValues(o.params, o.published)
	o.stats.Steps++
	o.stats.Samples += int64(samples)
	o.prog.add(int64(samples))
}

// applyDeltaLocked adds the pending averaging results to the parameters.
func (o *Optimizer) applyDeltaLocked() {
	off := 0
	for _, p := range o.params {
		tensor.Axpy(1, o.delta[off:off+p.Value.Len()], p.Value.Data)
		off += p.Value.Len()
	}
	clear(o.delta)
}

// averageModels averages the model with every live peer as the global
// average of round target, blocking, and publishes the result as the
// model of that round. Group results that arrived during the global
// average were computed from the models it replaced, and so will those
// still in flight be: they are dropped, or their corrections would pull
// each replica away from the mean again.
func (o *Optimizer) averageModels(ctx context.Context, target int) error {
	nn.FlatValues(o.params, o.flat)
	if err := o.syncAverage(ctx, fmt.Sprintf("%s/g/%d", o.cfg.RunID, target), o.flat); err != nil {
		return err
	}
	nn.SetFlatValues(o.params, o.flat)
	o.mu.Lock()
	defer o.mu.Unlock()
	nn.FlatValues(o.params, o.published)
	o.round, o.stats.Round = target, target
	clear(o.delta)
	o.syncs++
	return nil
}

// syncAverage averages vec with every live peer, blocking. It returns
// ctx's error if ctx ended.
func (o *Optimizer) syncAverage(ctx context.Context, id string, vec []float32) error {
	t0 := time.Now()
	ms := o.ranks.alive(o.ranks.allRanks())
	if len(ms) > 1 {
		res, err := o.avg.AllReduce(ctx, averaging.Session{ID: id, Members: ms}, vec)
		o.note(ctx, ms, res, err)
	}
	o.mu.Lock()
	o.stats.GlobalSyncs++
	o.stats.WaitSeconds += time.Since(t0).Seconds()
	o.mu.Unlock()
	return ctx.Err()
}

// averageInto all-reduces snap, the model of round snapRound, with the
// session and leaves the difference between the group's mean and snap as
// a correction for the next Step, so that local progress made meanwhile is
// kept. syncs is the count of synchronous global averages when snap was
// taken: if one has been applied since, the result is dropped
// (Stats.GroupDropped), since the global average replaced the models the
// group averaged.
func (o *Optimizer) averageInto(ctx context.Context, s averaging.Session, snap []float32, snapRound, syncs int) (averaging.Result, error) {
	avg := slices.Clone(snap)
	res, err := o.avg.AllReduce(ctx, s, avg)
	o.note(ctx, s.Members, res, err)
	if err != nil && ctx.Err() != nil {
		return res, err
	}
	tensor.Axpy(-1, snap, avg)
	o.mu.Lock()
	if o.syncs != syncs {
		o.stats.GroupDropped++
		o.mu.Unlock()
		return res, err
	}
	tensor.Axpy(1, avg, o.delta)
	if o.m != nil {
		o.m.staleness.Observe(float64(o.round - snapRound))
	}
	o.mu.Unlock()
	return res, err
}

// note records the outcome of a collective in the statistics and, over a
// fixed roster, gives up on members that failed or did not contribute.
func (o *Optimizer) note(ctx context.Context, members []averaging.Member, res averaging.Result, err error) {
	if o.m != nil {
		o.m.collective(ctx, len(members), res)
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	o.stats.BytesSent += res.Sent
	o.stats.BytesReceived += res.Received
	if ctx.Err() != nil {
		return // we stopped, not they
	}
	o.stats.Collectives++
	o.stats.CollectiveSeconds += res.Elapsed.Seconds()
	if err != nil || len(res.Failed) > 0 || len(res.Missing) > 0 {
		o.stats.Failures++
	}
	o.stats.MissingMembers += len(res.Missing)
	o.stats.DeclinedBy += len(res.Declined)
	o.stats.Disagreed += len(res.Disagreed)
	o.stats.FailedMembers += len(res.Failed)
	if err != nil {
		o.stats.Errors++
	}
	o.stats.Rejected += len(res.Rejected)
	if o.ranks != nil {
		o.stats.Revived += o.ranks.noteLocked(members, res, err)
	}
}

// hashString is FNV-1a of s, for signatures.
func hashString(h uint64, s string) uint64 {
	f := fnv.New64a()
	var b [8]byte
	for i := range b {
		b[i] = byte(h >> (8 * i))
	}
	f.Write(b[:])
	f.Write([]byte(s))
	return f.Sum64()
}
