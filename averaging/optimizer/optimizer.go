// Package optimizer is the training integration of group averaging, in the
// spirit of hivemind.Optimizer: it wraps any optim.Optimizer, and the
// caller's own training loop calls Step after computing its gradients. The
// wrapper decides when and with whom to average, over an averaging.Averager:
//
//   - WAGMA: wait-avoiding butterfly groups that change every round, the
//     first peer to arrive triggers its group, and a synchronous global
//     average every Tau rounds bounds staleness (fixed ranks), or
//     Moshpit-style groups formed through the DHT every wall-clock round
//     (no ranks; peers may join and leave);
//   - all-reduce SGD: every step, gradients (or models) averaged with all;
//   - local SGD: models averaged with all every Period steps;
//   - DiLoCo: InnerSteps steps of the wrapped optimizer alone, then the
//     pseudo-gradients are averaged with all and an outer Nesterov step is
//     taken (diloco.go);
//   - WA-DiLoCo: DiLoCo whose outer steps average in WAGMA's butterfly
//     groups, with a synchronous global outer step every Tau outer steps.
//
// It also serves its model and optimizer state to peers that join late
// (Join downloads it from several donors and cross-checks them), and
// publishes the swarm's progress in the DHT (Progress).
package optimizer

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/skyhive/skyhive/averaging"
	"github.com/skyhive/skyhive/dht"
	"github.com/skyhive/skyhive/nn"
	"github.com/skyhive/skyhive/optim"
	"github.com/skyhive/skyhive/tensor"
)

// Algo names a training algorithm that averages over the network.
type Algo string

// Algorithms an Optimizer runs.
const (
	// WAGMA is wait-avoiding group model averaging.
	WAGMA Algo = "wagma"
	// AllReduce is synchronous all-reduce SGD: every step, every peer
	// averages its gradients (or, with AverageModels, its model) with all
	// others and waits for them. Averaging gradients, it also averages
	// models every Period steps: replicas that took different steps when
	// an all-reduce failed (a member died or timed out) agree again.
	AllReduce Algo = "allreduce"
	// Local is local SGD: peers step alone and average their models with
	// all others every Period steps.
	Local Algo = "local"
	// DiLoCo is DiLoCo: InnerSteps steps of the wrapped optimizer alone,
	// then the pseudo-gradients θ_start − θ are averaged with every peer
	// and an outer SGD step with Nesterov momentum moves θ_start (see
	// diloco.go). The round counter counts outer steps.
	DiLoCo Algo = "diloco"
	// WADiLoCo is wait-avoiding DiLoCo: outer steps average the
	// pseudo-gradients in WAGMA's changing butterfly groups (in the
	// background, applied at the next Step), and every Tau outer steps a
	// synchronous global outer step over all peers bounds staleness.
	WADiLoCo Algo = "wa-diloco"
)

// ParseAlgo returns the algorithm named s.
func ParseAlgo(s string) (Algo, error) {
	switch a := Algo(s); a {
	case WAGMA, AllReduce, Local, DiLoCo, WADiLoCo:
		return a, nil
	}
	return "", fmt.Errorf("unknown averaging algorithm %q (want wagma, allreduce, local, diloco or wa-diloco)", s)
}

// Defaults of Config.
const (
	DefaultTau          = 10
	DefaultPeriod       = 10
	DefaultMaxInflight  = 4
	DefaultMaxDownloads = 2
)

// Config configures an Optimizer.
type Config struct {
	// Algo is the algorithm (WAGMA by default).
	Algo Algo
	// Rank is this peer's index in Roster (MatchRanks).
	Rank int
	// Roster lists every peer by rank; Weight is its bandwidth share.
	Roster []averaging.Member
	// GroupSize is WAGMA's group size S (averaging.DefaultGroupSize of the
	// roster; at least 3 with MatchDHT).
	GroupSize int
	// Tau is WAGMA's staleness bound: a synchronous global average every
	// Tau rounds (DefaultTau). MatchRanks only.
	Tau int
	// Period is local SGD's averaging period in steps, and all-reduce
	// SGD's model re-synchronization period (DefaultPeriod).
	Period int
	// AverageModels makes AllReduce average models after the optimizer
	// step instead of gradients before it.
	AverageModels bool
	// RunID prefixes session IDs and DHT keys so that runs sharing peers
	// do not mix ("run").
	RunID string
	// MaxInflight bounds the background group all-reduces at once
	// (DefaultMaxInflight); activations beyond it are declined, and the
	// group is told so at once (averaging.Averager.Decline) and goes on
	// without this peer. WA-DiLoCo, whose group outer steps run one after
	// the other, also declines while one of them waits to begin.
	MaxInflight int
	// RoundWindow is how far from this peer's round counter an activation
	// may name a round (2·Tau+2): honest peers are never further apart, since
	// a global average every Tau rounds resets every counter. Activations
	// outside it, or from peers not in Roster, are refused and counted in
	// Stats.Refused.
	RoundWindow int

	// Matchmaking is how WAGMA finds its groups: averaging.MatchRanks
	// (butterfly groups over Roster, the default) or averaging.MatchDHT
	// (groups through DHT every RoundInterval, no ranks: Roster may be
	// empty and there is no global τ barrier; the grid rounds mix the
	// models instead).
	Matchmaking averaging.Matchmaking
	// DHT is the node MatchDHT declares in, and where progress is
	// published (nil: no progress records).
	DHT *dht.Node
	// RoundInterval, MatchWindow and GridDims configure MatchDHT (see
	// averaging.MatchConfig).
	RoundInterval time.Duration
	MatchWindow   time.Duration
	GridDims      int
	// Model is the signature of the model trained ("" derives one from the
	// parameters' names and shapes); peers with another are not averaged
	// with and do not serve or receive state.
	Model string

	// MaxDownloads bounds the state downloads this peer serves at once
	// (DefaultMaxDownloads); more are told the donor is busy.
	MaxDownloads int
	// TargetBatchSize is the number of samples, summed over the swarm, that
	// makes an epoch of the swarm's progress (0: epochs do not advance).
	TargetBatchSize int64
	// ProgressEvery is how often progress is published and read
	// (RoundInterval, or 2 s).
	ProgressEvery time.Duration

	// InnerSteps is DiLoCo's H: steps of the wrapped optimizer between
	// outer steps (0: DefaultInnerSteps; negative is refused). DiLoCo and
	// WA-DiLoCo only, as are WarmupInnerSteps, OuterLR and OuterMomentum;
	// Fragments and OverlapSteps are DiLoCo's only.
	InnerSteps int
	// WarmupInnerSteps, if positive, is the H of the first outer step,
	// doubled at every outer step until it reaches InnerSteps. Replicas
	// that start from the same weights drift apart fastest in their first
	// steps, so an outer step after a whole H averages models that have
	// little in common; short first outer steps keep them together while
	// they do. 0: every outer step after InnerSteps; negative or above
	// InnerSteps is refused.
	WarmupInnerSteps int
	// OuterLR is the outer learning rate η (0: DefaultOuterLR; negative,
	// NaN or infinite is refused).
	OuterLR float64
	// OuterMomentum is the outer Nesterov momentum μ in [0, 1) (0:
	// DefaultOuterMomentum; NoMomentum: plain outer SGD; anything else
	// outside [0, 1) is refused).
	OuterMomentum float64
	// Fragments, if above 1, makes DiLoCo's outer steps Streaming
	// DiLoCo's: the parameters are cut into this many contiguous
	// fragments that take their outer steps in turn, one every
	// InnerSteps/Fragments inner steps (see streaming.go). At most
	// InnerSteps; DiLoCo without a warm-up only; 0 or 1: whole-model
	// outer steps.
	Fragments int
	// OverlapSteps is how many inner steps a (fragment's) outer step's
	// all-reduce may overlap before Step waits for it and applies it,
	// keeping the progress made meanwhile (0: Step waits at once, as
	// DiLoCo; below InnerSteps; DiLoCo without a warm-up only).
	OverlapSteps int

	// Metrics, if set, receives the optimizer's Prometheus collector
	// (rounds, group sizes, bytes, stragglers dropped, staleness; see
	// docs/observability.md), unregistered by Close. Nil: no metrics.
	Metrics prometheus.Registerer
}

// StepInfo describes one finished local step, for progress reporting.
type StepInfo struct {
	Step  int // local steps done
	Round int // the round counter (WAGMA may jump it forward)
}

// Stats summarises an optimizer's averaging.
type Stats struct {
	Rank          int     `json:"rank"`
	Steps         int     `json:"steps"`
	Round         int     `json:"round"`
	Samples       int64   `json:"samples"`
	WaitSeconds   float64 `json:"wait_seconds"` // blocked in synchronous averaging
	GroupActive   int     `json:"group_active"` // group rounds this peer activated
	GroupPassive  int     `json:"group_passive"`
	GroupDeclined int     `json:"group_declined"`
	GlobalSyncs   int     `json:"global_syncs"`
	Groups        int     `json:"groups,omitempty"`        // MatchDHT groups averaged in
	GroupMembers  int     `json:"group_members,omitempty"` // their sizes summed
	Alone         int     `json:"alone,omitempty"`         // MatchDHT rounds without a partner
	MatchErrors   int     `json:"match_errors,omitempty"`  // MatchDHT rounds lost to DHT errors
	Mismatched    int     `json:"mismatched,omitempty"`    // declarations of peers with another model, ignored
	Failures      int     `json:"failures"`                // collectives with failed or missing members
	Dead          int     `json:"dead"`                    // peers given up on (MatchRanks)
	BytesSent     int64   `json:"bytes_sent"`
	BytesReceived int64   `json:"bytes_received"`
	StatesServed  int     `json:"states_served"`
	// Refused counts activations refused: from a peer outside the roster,
	// or naming a round outside RoundWindow.
	Refused int `json:"refused,omitempty"`
	// Rejected counts members whose contribution to this peer's part was
	// rejected by the averager (norm check or robust aggregation), summed
	// over collectives.
	Rejected int `json:"rejected,omitempty"`
	// OuterSteps counts DiLoCo outer steps applied (global and group);
	// their bytes are in BytesSent and BytesReceived.
	OuterSteps int `json:"outer_steps,omitempty"`
	// OuterDropped counts WA-DiLoCo group outer steps whose result came
	// after a global outer step had superseded it, and was dropped.
	OuterDropped int `json:"outer_dropped,omitempty"`
	// GroupDropped counts WAGMA group averages whose result came after a
	// synchronous global average had superseded it, and was dropped.
	GroupDropped int `json:"group_dropped,omitempty"`
	// Collectives counts the all-reduces this peer took part in (group and
	// global), and CollectiveSeconds sums their wall time.
	Collectives       int     `json:"collectives,omitempty"`
	CollectiveSeconds float64 `json:"collective_seconds,omitempty"`
	// QueueSeconds sums the time WA-DiLoCo's outer steps waited for this
	// peer's previous one to end before they could begin.
	QueueSeconds float64 `json:"queue_seconds,omitempty"`
	// MissingMembers, FailedMembers and Errors say why collectives failed:
	// members whose contribution did not arrive within ReduceWait, members
	// whose part could not be averaged, and collectives that returned an
	// error (summed over collectives).
	MissingMembers int `json:"missing_members,omitempty"`
	FailedMembers  int `json:"failed_members,omitempty"`
	Errors         int `json:"errors,omitempty"`
	// DeclinedBy counts members that declined collectives of this peer
	// (they were busy): not failures, and not given up on.
	DeclinedBy int `json:"declined_by,omitempty"`
	// Disagreed counts members that joined collectives of this peer with
	// another member list (one side had given up on a peer the other had
	// not): alive, so not failures; Revived counts the members given up
	// on that were taken back because of it (MatchRanks).
	Disagreed int `json:"disagreed,omitempty"`
	Revived   int `json:"revived,omitempty"`
}

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
	mm     *averaging.Matchmaker // MatchDHT only

	onGroup func(GroupInfo)

	bgCtx    context.Context
	cancelBG context.CancelFunc
	start    sync.Once
	inflight chan struct{}
	bg       sync.WaitGroup
	global   atomic.Int64 // highest global round announced to us
	flat     []float32
	// lastGlobal is the last global round joined (Step's goroutine only).
	lastGlobal int

	mu        sync.Mutex
	closed    bool
	started   bool
	published []float32 // the model after the last Step
	delta     []float32 // averaging results not yet applied
	round     int       // round counter of the published model
	// syncs counts the global averages (WAGMA) and global outer steps
	// (WA-DiLoCo) applied: a group average or group outer step taken from
	// a snapshot before one is superseded by it and dropped.
	syncs    int
	joined   map[string]int
	dead     map[peer.ID]bool // fixed roster: members dropped (see note)
	seen     map[peer.ID]bool // fixed roster: members that took part once
	misses   map[peer.ID]int  // fixed roster: all-reduces missed in a row
	stats    Stats
	progress progressTracker
	serving  map[peer.ID]*download

	dl *outer // DiLoCo and WA-DiLoCo only

	m *optimizerMetrics // nil without Config.Metrics
}

// New returns an optimizer over avg's transport that steps inner; it
// registers the activation and state handlers there. Nothing runs in the
// background until the first Step.
func New(avg *averaging.Averager, inner optim.Optimizer, cfg Config) (*Optimizer, error) {
	if cfg.Algo == "" {
		cfg.Algo = WAGMA
	}
	if _, err := ParseAlgo(string(cfg.Algo)); err != nil {
		return nil, err
	}
	mm, err := averaging.ParseMatchmaking(string(cfg.Matchmaking))
	if err != nil {
		return nil, err
	}
	cfg.Matchmaking = mm
	p := len(cfg.Roster)
	if mm == averaging.MatchDHT {
		if cfg.Algo != WAGMA || cfg.DHT == nil {
			return nil, errors.New("averaging: DHT matchmaking needs the wagma algorithm and a DHT node")
		}
		if cfg.RoundInterval <= 0 {
			cfg.RoundInterval = averaging.DefaultRoundInterval
		}
		if cfg.GroupSize == 0 {
			cfg.GroupSize = max(averaging.DefaultGroupSize(p), 3)
		}
	} else {
		if p == 0 || cfg.Rank < 0 || cfg.Rank >= p {
			return nil, fmt.Errorf("averaging: rank %d of %d peers", cfg.Rank, p)
		}
		if cfg.Roster[cfg.Rank].Peer.ID != avg.Transport().ID() {
			return nil, fmt.Errorf("averaging: roster rank %d is %s, not this peer", cfg.Rank, cfg.Roster[cfg.Rank].Peer.ID)
		}
	}
	if cfg.GroupSize == 0 {
		cfg.GroupSize = averaging.DefaultGroupSize(p)
	}
	if cfg.GroupSize < 2 {
		return nil, fmt.Errorf("averaging: group size %d, want at least 2", cfg.GroupSize)
	}
	if cfg.Tau <= 0 {
		cfg.Tau = DefaultTau
	}
	if cfg.Period <= 0 {
		cfg.Period = DefaultPeriod
	}
	if cfg.RunID == "" {
		cfg.RunID = "run"
	}
	if cfg.MaxInflight <= 0 {
		cfg.MaxInflight = DefaultMaxInflight
	}
	if cfg.RoundWindow <= 0 {
		cfg.RoundWindow = 2*cfg.Tau + 2
	}
	if cfg.MaxDownloads <= 0 {
		cfg.MaxDownloads = DefaultMaxDownloads
	}
	if cfg.ProgressEvery <= 0 {
		cfg.ProgressEvery = cfg.RoundInterval
		if cfg.ProgressEvery <= 0 {
			cfg.ProgressEvery = 2 * time.Second
		}
	}
	params := inner.Params()
	n := 0
	for _, q := range params {
		n += q.Value.Len()
	}
	if n == 0 || n > avg.Config().MaxElements {
		return nil, fmt.Errorf("averaging: model of %d parameters", n)
	}
	var dl *outer
	if cfg.Algo == DiLoCo || cfg.Algo == WADiLoCo {
		if dl, err = newOuter(&cfg, params, n); err != nil {
			return nil, err
		}
	} else if _, err := newStream(cfg, n); err != nil {
		return nil, err // fragments or overlap steps given to another algorithm
	}
	layout := NewLayout(params, dl.withState(inner.State()))
	if cfg.Model == "" {
		cfg.Model = fmt.Sprintf("%d-params-%x", n, layout.Hash)
	}
	ctx, cancel := context.WithCancel(context.Background())
	o := &Optimizer{
		cfg: cfg, avg: avg, inner: inner, params: params, n: n, layout: layout,
		bgCtx: ctx, cancelBG: cancel,
		inflight: make(chan struct{}, cfg.MaxInflight), flat: make([]float32, n), lastGlobal: -1,
		joined: map[string]int{}, dead: map[peer.ID]bool{}, seen: map[peer.ID]bool{}, misses: map[peer.ID]int{},
		published: make([]float32, n), delta: make([]float32, n),
		serving: map[peer.ID]*download{}, dl: dl,
	}
	nn.FlatValues(params, o.published)
	o.stats.Rank = cfg.Rank
	o.progress.target = cfg.TargetBatchSize
	if mm == averaging.MatchDHT {
		o.mm = averaging.NewMatchmaker(cfg.DHT, avg.Transport(), averaging.MatchConfig{
			Run: cfg.RunID, Interval: cfg.RoundInterval, Window: cfg.MatchWindow,
			GroupSize: cfg.GroupSize, Dims: cfg.GridDims, Model: cfg.Model,
		})
	}
	if cfg.Metrics != nil {
		if o.m, err = newOptimizerMetrics(o, cfg.Metrics); err != nil {
			cancel()
			return nil, err
		}
	}
	avg.Transport().SetHandler(ActivateProtocol, o.handleActivate)
	avg.Transport().SetHandler(StateProtocol, o.handleState)
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
	if o.dl == nil {
		return o.Snapshot()
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	return append([]float32(nil), o.dl.anchor...)
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
	s.Dead = len(o.dead)
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
// the Add.
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

// startBackground starts the matchmaking and progress loops, once.
func (o *Optimizer) startBackground() {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.started = true
	if o.mm != nil {
		o.goLocked(func() { o.matchLoop(o.bgCtx) })
	}
	if o.cfg.DHT != nil {
		o.goLocked(func() { o.progressLoop(o.bgCtx) })
	}
}

// ErrClosed is returned by Step after Close.
var ErrClosed = errors.New("averaging: optimizer closed")

// Step applies the wrapped optimizer's step with the gradients the caller
// computed on samples examples, and averages as the algorithm says: for
// all-reduce SGD it first averages the gradients with every peer; for
// WAGMA it applies the group averages that arrived and joins (or
// activates) this round's group in the background, or the global average
// every Tau rounds; for local SGD it averages with every peer every Period
// steps. It returns ctx's error if ctx ended while it waited.
func (o *Optimizer) Step(ctx context.Context, samples int) error {
	o.start.Do(o.startBackground)
	o.mu.Lock()
	closed, round := o.closed, o.round
	o.mu.Unlock()
	if closed {
		return ErrClosed
	}
	if o.dl != nil {
		return o.stepOuter(ctx, samples, round)
	}
	if o.cfg.Algo == AllReduce && !o.cfg.AverageModels {
		nn.FlatGrads(o.params, o.flat)
		if err := o.syncAverage(ctx, fmt.Sprintf("%s/grad/%d", o.cfg.RunID, round), o.flat); err != nil {
			return err
		}
		nn.SetFlatGrads(o.params, o.flat)
	}
	round++
	// Step, apply averages that arrived meanwhile and publish the model in
	// one critical section: a snapshot taken in between would miss the
	// applied delta and count it twice, and state served to a joiner must
	// match the optimizer's buffers.
	o.mu.Lock()
	o.inner.Step()
	o.applyDeltaLocked()
	nn.FlatValues(o.params, o.published)
	o.round = round
	o.stats.Steps++
	o.stats.Round = round
	o.stats.Samples += int64(samples)
	o.progress.add(int64(samples))
	o.mu.Unlock()

	target := -1
	switch o.cfg.Algo {
	case AllReduce:
		if o.cfg.AverageModels || round%o.cfg.Period == 0 {
			target = round
		}
	case Local:
		if round%o.cfg.Period == 0 {
			target = round
		}
	case WAGMA:
		if o.mm != nil {
			break // the matchmaking loop averages in the background
		}
		if k := int(o.global.Load()); k > o.lastGlobal && k >= round {
			target = k // another peer started a global round: join it now
		} else if round%o.cfg.Tau == 0 {
			target = round
		}
	}
	if target >= 0 {
		if o.cfg.Algo == WAGMA {
			o.activateAll(ctx, target)
		}
		nn.FlatValues(o.params, o.flat)
		if err := o.syncAverage(ctx, fmt.Sprintf("%s/g/%d", o.cfg.RunID, target), o.flat); err != nil {
			return err
		}
		nn.SetFlatValues(o.params, o.flat)
		round, o.lastGlobal = target, target
		o.mu.Lock()
		nn.FlatValues(o.params, o.published)
		o.round, o.stats.Round = round, round
		// Group results that arrived during the global average were
		// computed from the models it replaced, and so will those still
		// in flight be: drop them, or their corrections would pull each
		// replica away from the mean again.
		clear(o.delta)
		o.syncs++
		o.mu.Unlock()
	}
	if o.cfg.Algo == WAGMA && target < 0 && o.mm == nil {
		o.startGroup(round, true)
	}
	return nil
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

// note records the outcome of a collective, giving up on members that
// failed or did not contribute (MatchRanks).
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
	if o.mm != nil {
		return
	}
	// A member that took part before and then missed is dead (killed,
	// crashed, left). One that never took part may just be slow to start
	// (loading data, a late joiner of a fixed roster): it is dropped only
	// after neverSeenMisses all-reduces in a row without it, or everyone
	// would train alone after a slow start.
	bad := map[peer.ID]bool{}
	for _, id := range append(res.Failed, res.Missing...) {
		bad[id] = true
	}
	alive := map[peer.ID]bool{}
	for _, id := range res.Declined {
		alive[id] = true
	}
	for _, id := range res.Disagreed {
		alive[id] = true
		// A member given up on that still calls us is alive; taking it
		// back makes our member lists agree again, or the two sides of a
		// different view of who is dead would fail every collective.
		if o.dead[id] {
			delete(o.dead, id)
			o.stats.Revived++
		}
	}
	self := o.avg.Transport().ID()
	for _, m := range members {
		id := m.Peer.ID
		switch {
		case id == self:
		case alive[id]:
			// It declined (busy) or joined with another member list
			// (it gave up on someone we have not, or the other way
			// round): alive either way.
			delete(o.misses, id)
		case !bad[id]:
			if err == nil {
				o.seen[id] = true
			}
			delete(o.misses, id)
		default:
			o.misses[id]++
			if o.seen[id] || o.misses[id] >= neverSeenMisses {
				o.dead[id] = true
			}
		}
	}
}

// neverSeenMisses is how many all-reduces in a row a member of a fixed
// roster that never took part may miss before it is dropped.
const neverSeenMisses = 5

// syncAverage averages vec with every live peer, blocking. It returns
// ctx's error if ctx ended.
func (o *Optimizer) syncAverage(ctx context.Context, id string, vec []float32) error {
	t0 := time.Now()
	ms := o.alive(o.allRanks())
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
