package averaging

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/skyhive/skyhive/dht"
	"github.com/skyhive/skyhive/nn"
	"github.com/skyhive/skyhive/optim"
	"github.com/skyhive/skyhive/p2p"
	"github.com/skyhive/skyhive/tensor"
	"github.com/skyhive/skyhive/wire"
)

// Algo names a training algorithm that averages over the network.
type Algo string

// Algorithms a Worker runs.
const (
	// WAGMA is wait-avoiding group model averaging with butterfly groups
	// and a global average every Tau rounds.
	WAGMA Algo = "wagma"
	// AllReduce is synchronous all-reduce SGD: every step, every peer
	// averages its gradients (or, with AverageModels, its model) with all
	// others and waits for them.
	AllReduce Algo = "allreduce"
	// Local is local SGD: peers step alone and average their models with
	// all others every Period steps.
	Local Algo = "local"
)

// ParseAlgo returns the algorithm named s.
func ParseAlgo(s string) (Algo, error) {
	switch a := Algo(s); a {
	case WAGMA, AllReduce, Local:
		return a, nil
	}
	return "", fmt.Errorf("averaging: unknown algorithm %q (want wagma, allreduce or local)", s)
}

// Defaults of WorkerConfig.
const (
	DefaultTau         = 10
	DefaultPeriod      = 10
	DefaultMaxInflight = 4
)

// WorkerConfig configures a Worker.
type WorkerConfig struct {
	// Algo is the algorithm (WAGMA by default).
	Algo Algo
	// Rank is this peer's index in Roster.
	Rank int
	// Roster lists every peer by rank; Weight is its bandwidth share.
	Roster []Member
	// GroupSize is WAGMA's group size S (DefaultGroupSize(len(Roster))).
	GroupSize int
	// Tau is WAGMA's staleness bound: a synchronous global average every
	// Tau rounds (DefaultTau).
	Tau int
	// Period is local SGD's averaging period in steps (DefaultPeriod).
	Period int
	// AverageModels makes AllReduce average models after the optimizer
	// step instead of gradients before it.
	AverageModels bool
	// Steps stops the worker after this many local steps (0: until ctx ends).
	Steps int
	// RunID prefixes session IDs so that runs sharing peers do not mix
	// ("run").
	RunID string
	// MaxInflight bounds the background group all-reduces at once
	// (DefaultMaxInflight); activations beyond it are declined, and the
	// group drops this peer after ReduceWait.
	MaxInflight int

	// Matchmaking is how WAGMA finds its groups: MatchRanks (butterfly
	// groups over Roster, the default) or MatchDHT (Moshpit-style groups
	// through DHT, no ranks: Roster and Rank are then only labels and may
	// be empty; there is no global τ barrier, the grid rounds mix the
	// models instead).
	Matchmaking Matchmaking
	// DHT is the node MatchDHT declares in and reads from.
	DHT *dht.Node
	// RoundInterval is the wall-clock length of a MatchDHT round
	// (DefaultRoundInterval); rounds are aligned to multiples of it.
	RoundInterval time.Duration
	// MatchWindow is how long after a round starts MatchDHT waits for
	// declarations before reading the group (RoundInterval/4).
	MatchWindow time.Duration
	// GridDims is the number of dimensions of MatchDHT's grid, whose side
	// is GroupSize (DefaultGridDims).
	GridDims int
}

// ComputeFunc computes the gradients of the worker's parameters for local
// step `step` (they are zeroed before) and returns the loss.
type ComputeFunc func(ctx context.Context, step int) (loss float64, err error)

// StepInfo describes one finished local step, for progress reporting.
type StepInfo struct {
	Rank    int
	Step    int // local steps done
	Round   int // the round counter (WAGMA may jump it forward)
	Loss    float64
	Elapsed time.Duration
}

// Stats summarises a worker's run.
type Stats struct {
	Rank          int     `json:"rank"`
	Steps         int     `json:"steps"`
	Round         int     `json:"round"`
	Seconds       float64 `json:"seconds"`
	WaitSeconds   float64 `json:"wait_seconds"` // blocked in synchronous averaging
	GroupActive   int     `json:"group_active"` // group rounds this peer activated
	GroupPassive  int     `json:"group_passive"`
	GroupDeclined int     `json:"group_declined"`
	GlobalSyncs   int     `json:"global_syncs"`
	Groups        int     `json:"groups,omitempty"`        // MatchDHT groups averaged in
	GroupMembers  int     `json:"group_members,omitempty"` // their sizes summed
	Alone         int     `json:"alone,omitempty"`         // MatchDHT rounds without a partner
	MatchErrors   int     `json:"match_errors,omitempty"`  // MatchDHT rounds lost to DHT errors
	Failures      int     `json:"failures"`                // collectives with failed or missing members
	Dead          int     `json:"dead"`                    // peers given up on
	LastLoss      float64 `json:"last_loss"`
}

// Worker trains one peer's replica and averages it with the others as its
// algorithm says. The caller supplies the parameters, the optimizer and the
// gradient computation; the worker owns the parameters while Run runs.
type Worker struct {
	cfg     WorkerConfig
	avg     *Averager
	params  []*nn.Param
	opt     optim.Optimizer
	compute ComputeFunc
	onStep  func(StepInfo)
	onGroup func(GroupInfo)
	mm      *matchmaker // MatchDHT only
	n       int

	running  atomic.Bool
	runCtx   context.Context
	inflight chan struct{}
	bg       sync.WaitGroup
	global   atomic.Int64 // highest global round announced to us

	mu        sync.Mutex
	published []float32 // the model after the last local step
	delta     []float32 // averaging results not yet applied
	round     int       // round counter of the published model
	joined    map[string]int
	dead      map[peer.ID]bool
	stats     Stats
}

// NewWorker returns a worker over avg's transport; it registers the
// activation and state handlers there.
func NewWorker(avg *Averager, params []*nn.Param, opt optim.Optimizer, compute ComputeFunc, cfg WorkerConfig) (*Worker, error) {
	if cfg.Algo == "" {
		cfg.Algo = WAGMA
	}
	if _, err := ParseAlgo(string(cfg.Algo)); err != nil {
		return nil, err
	}
	mm, err := ParseMatchmaking(string(cfg.Matchmaking))
	if err != nil {
		return nil, err
	}
	cfg.Matchmaking = mm
	p := len(cfg.Roster)
	if mm == MatchDHT {
		if cfg.Algo != WAGMA || cfg.DHT == nil {
			return nil, errors.New("averaging: DHT matchmaking needs the wagma algorithm and a DHT node")
		}
		if cfg.RoundInterval <= 0 {
			cfg.RoundInterval = DefaultRoundInterval
		}
		if cfg.MatchWindow <= 0 || cfg.MatchWindow >= cfg.RoundInterval {
			cfg.MatchWindow = cfg.RoundInterval / 4
		}
		if cfg.GridDims <= 0 {
			cfg.GridDims = DefaultGridDims
		}
		if cfg.GroupSize == 0 {
			cfg.GroupSize = max(DefaultGroupSize(p), 3)
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
		cfg.GroupSize = DefaultGroupSize(p)
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
	n := 0
	for _, q := range params {
		n += q.Value.Len()
	}
	if n == 0 || n > avg.Config().MaxElements {
		return nil, fmt.Errorf("averaging: model of %d parameters", n)
	}
	w := &Worker{
		cfg: cfg, avg: avg, params: params, opt: opt, compute: compute, n: n,
		inflight: make(chan struct{}, cfg.MaxInflight),
		joined:   map[string]int{}, dead: map[peer.ID]bool{},
		published: make([]float32, n), delta: make([]float32, n),
		runCtx: context.Background(),
	}
	flattenValues(params, w.published)
	w.stats.Rank = cfg.Rank
	if mm == MatchDHT {
		w.mm = newMatchmaker(cfg.DHT, avg.Transport(), cfg.RunID, cfg.RoundInterval, cfg.MatchWindow, cfg.GroupSize, cfg.GridDims)
	}
	avg.Transport().SetHandler(ActivateProtocol, w.handleActivate)
	avg.Transport().SetHandler(StateProtocol, w.handleState)
	return w, nil
}

// OnStep sets a callback run after every local step (from Run's goroutine).
func (w *Worker) OnStep(f func(StepInfo)) { w.onStep = f }

// GroupInfo describes one MatchDHT group all-reduce this peer took part in.
type GroupInfo struct {
	Round   int // the wall-clock matchmaking round
	Key     string
	Members []peer.ID
	Result  Result
	Err     error
}

// OnGroup sets a callback run after every MatchDHT group all-reduce (from
// the matchmaking goroutine). Set it before Run.
func (w *Worker) OnGroup(f func(GroupInfo)) { w.onGroup = f }

// Snapshot returns a copy of the model after the last local step, with
// averaging results that arrived since applied.
func (w *Worker) Snapshot() []float32 {
	w.mu.Lock()
	defer w.mu.Unlock()
	out := make([]float32, w.n)
	copy(out, w.published)
	tensor.Axpy(1, w.delta, out)
	return out
}

// Stats returns the statistics so far.
func (w *Worker) Stats() Stats {
	w.mu.Lock()
	defer w.mu.Unlock()
	s := w.stats
	s.Dead = len(w.dead)
	return s
}

func flattenValues(ps []*nn.Param, dst []float32) {
	o := 0
	for _, p := range ps {
		o += copy(dst[o:], p.Value.Data)
	}
}

func unflattenValues(ps []*nn.Param, src []float32) {
	o := 0
	for _, p := range ps {
		o += copy(p.Value.Data, src[o:])
	}
}

func flattenGrads(ps []*nn.Param, dst []float32) {
	o := 0
	for _, p := range ps {
		o += copy(dst[o:], p.Grad.Data)
	}
}

func unflattenGrads(ps []*nn.Param, src []float32) {
	o := 0
	for _, p := range ps {
		o += copy(p.Grad.Data, src[o:])
	}
}

// Run trains until ctx ends or Steps local steps are done, then waits for
// its background all-reduces. It returns nil when ctx ends.
func (w *Worker) Run(ctx context.Context) (Stats, error) {
	if !w.running.CompareAndSwap(false, true) {
		return w.Stats(), errors.New("averaging: worker already running")
	}
	bgCtx, cancelBG := context.WithCancel(ctx)
	w.mu.Lock()
	w.runCtx = bgCtx
	w.mu.Unlock()
	defer func() {
		w.running.Store(false)
		cancelBG()
		w.bg.Wait()
	}()
	start := time.Now()
	if w.mm != nil {
		w.bg.Go(func() { w.matchLoop(bgCtx) })
	}
	flat := make([]float32, w.n)
	lastGlobal := -1
	steps := 0
	for w.cfg.Steps <= 0 || steps < w.cfg.Steps {
		if ctx.Err() != nil {
			break
		}
		w.opt.ZeroGrad()
		w.mu.Lock()
		round := w.round
		w.mu.Unlock()
		loss, err := w.compute(ctx, steps)
		if err != nil {
			if ctx.Err() != nil {
				break
			}
			return w.Stats(), fmt.Errorf("averaging: step %d: %w", steps, err)
		}
		if w.cfg.Algo == AllReduce && !w.cfg.AverageModels {
			flattenGrads(w.params, flat)
			if !w.syncAverage(ctx, fmt.Sprintf("%s/grad/%d", w.cfg.RunID, round), flat) {
				break
			}
			unflattenGrads(w.params, flat)
		}
		w.opt.Step()
		steps++
		round++

		// Apply averages that arrived during the step, then average as the
		// algorithm says.
		w.mu.Lock()
		if w.cfg.Algo == WAGMA {
			w.applyDeltaLocked()
		}
		w.mu.Unlock()
		target := -1
		switch w.cfg.Algo {
		case AllReduce:
			if w.cfg.AverageModels {
				target = round
			}
		case Local:
			if round%w.cfg.Period == 0 {
				target = round
			}
		case WAGMA:
			if w.mm != nil {
				break // the matchmaking loop averages in the background
			}
			if k := int(w.global.Load()); k > lastGlobal && k >= round {
				target = k // another peer started a global round: join it now
			} else if round%w.cfg.Tau == 0 {
				target = round
			}
		}
		if target >= 0 {
			if w.cfg.Algo == WAGMA {
				w.activateAll(ctx, target)
			}
			flattenValues(w.params, flat)
			if !w.syncAverage(ctx, fmt.Sprintf("%s/g/%d", w.cfg.RunID, target), flat) {
				break
			}
			unflattenValues(w.params, flat)
			round, lastGlobal = target, target
		}
		w.mu.Lock()
		flattenValues(w.params, w.published)
		w.round = round
		w.stats.Steps, w.stats.Round, w.stats.LastLoss = steps, round, loss
		w.stats.Seconds = time.Since(start).Seconds()
		w.mu.Unlock()
		if w.cfg.Algo == WAGMA && target < 0 && w.mm == nil {
			w.startGroup(round, true)
		}
		if w.onStep != nil {
			w.onStep(StepInfo{Rank: w.cfg.Rank, Step: steps, Round: round, Loss: loss, Elapsed: time.Since(start)})
		}
	}
	w.mu.Lock()
	w.stats.Seconds = time.Since(start).Seconds()
	w.mu.Unlock()
	return w.Stats(), nil
}

// applyDeltaLocked adds the pending averaging results to the parameters.
func (w *Worker) applyDeltaLocked() {
	o := 0
	for _, p := range w.params {
		tensor.Axpy(1, w.delta[o:o+p.Value.Len()], p.Value.Data)
		o += p.Value.Len()
	}
	clear(w.delta)
}

// alive returns the members at the given ranks that are not given up on.
func (w *Worker) alive(ranks []int) []Member {
	w.mu.Lock()
	defer w.mu.Unlock()
	var ms []Member
	for _, r := range ranks {
		m := w.cfg.Roster[r]
		if r == w.cfg.Rank || !w.dead[m.Peer.ID] {
			ms = append(ms, m)
		}
	}
	return ms
}

func (w *Worker) allRanks() []int {
	r := make([]int, len(w.cfg.Roster))
	for i := range r {
		r[i] = i
	}
	return r
}

// note records the outcome of a collective, giving up on members that
// failed or did not contribute.
func (w *Worker) note(ctx context.Context, res Result, err error) {
	if ctx.Err() != nil {
		return // we stopped, not they
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if err != nil || len(res.Failed) > 0 || len(res.Missing) > 0 {
		w.stats.Failures++
	}
	for _, id := range append(res.Failed, res.Missing...) {
		w.dead[id] = true
	}
}

// syncAverage averages vec with every live peer, blocking. It returns false
// if ctx ended.
func (w *Worker) syncAverage(ctx context.Context, id string, vec []float32) bool {
	t0 := time.Now()
	ms := w.alive(w.allRanks())
	if len(ms) > 1 {
		res, err := w.avg.AllReduce(ctx, Session{ID: id, Members: ms}, vec)
		w.note(ctx, res, err)
	}
	w.mu.Lock()
	w.stats.GlobalSyncs++
	w.stats.WaitSeconds += time.Since(t0).Seconds()
	w.mu.Unlock()
	return ctx.Err() == nil
}

// activateAll tells every live peer that global round k has started.
func (w *Worker) activateAll(ctx context.Context, k int) {
	msg := activation{Kind: activateGlobal, Round: uint64(k)}.marshal()
	var wg sync.WaitGroup
	for _, m := range w.alive(w.allRanks()) {
		if m.Peer.ID == w.avg.Transport().ID() {
			continue
		}
		wg.Go(func() {
			cctx, cancel := context.WithTimeout(ctx, w.avg.Config().ReduceWait)
			defer cancel()
			_, _ = w.avg.Transport().Call(cctx, m.Peer, ActivateProtocol, msg)
		})
	}
	// Activations are small; waiting for them keeps goroutines bounded and
	// makes sure the others learn of the round before we block in it.
	wg.Wait()
}

// startGroup joins WAGMA's group round in the background unless this peer
// already has; active says whether this peer is the activator.
func (w *Worker) startGroup(round int, active bool) {
	ranks, index, err := ButterflyGroup(w.cfg.Rank, len(w.cfg.Roster), w.cfg.GroupSize, round)
	if err != nil {
		return
	}
	ms := w.alive(ranks)
	if len(ms) < 2 {
		return
	}
	id := fmt.Sprintf("%s/w/%d/%d", w.cfg.RunID, round, index)
	w.mu.Lock()
	if _, ok := w.joined[id]; ok || !w.running.Load() {
		w.mu.Unlock()
		return
	}
	select {
	case w.inflight <- struct{}{}:
	default:
		w.stats.GroupDeclined++
		w.mu.Unlock()
		return
	}
	w.joined[id] = round
	for k, r := range w.joined { // forget rounds long past
		if r < round-64 {
			delete(w.joined, k)
		}
	}
	if active {
		w.stats.GroupActive++
	} else {
		w.stats.GroupPassive++
	}
	ctx := w.runCtx
	snap := make([]float32, w.n)
	copy(snap, w.published)
	tensor.Axpy(1, w.delta, snap)
	w.mu.Unlock()

	w.bg.Go(func() {
		defer func() { <-w.inflight }()
		if active {
			msg := activation{Kind: activateGroup, Round: uint64(round)}.marshal()
			var wg sync.WaitGroup
			for _, m := range ms {
				if m.Peer.ID == w.avg.Transport().ID() {
					continue
				}
				wg.Go(func() {
					cctx, cancel := context.WithTimeout(ctx, w.avg.Config().ReduceWait)
					defer cancel()
					_, _ = w.avg.Transport().Call(cctx, m.Peer, ActivateProtocol, msg)
				})
			}
			defer wg.Wait()
		}
		avg := make([]float32, w.n)
		copy(avg, snap)
		res, err := w.avg.AllReduce(ctx, Session{ID: id, Members: ms}, avg)
		w.note(ctx, res, err)
		if err != nil && ctx.Err() != nil {
			return
		}
		// The group's mean replaces our contribution; keep the local
		// progress made since the snapshot.
		tensor.Axpy(-1, snap, avg)
		w.mu.Lock()
		tensor.Axpy(1, avg, w.delta)
		w.mu.Unlock()
	})
}

func (w *Worker) handleActivate(ctx context.Context, from peer.ID, req []byte) ([]byte, error) {
	a, err := unmarshalActivation(req)
	if err != nil {
		return nil, err
	}
	if !w.running.Load() {
		return nil, errors.New("averaging: worker not running")
	}
	if w.mm != nil {
		return nil, errors.New("averaging: this peer matches groups through the DHT")
	}
	switch a.Kind {
	case activateGlobal:
		for {
			cur := w.global.Load()
			if int64(a.Round) <= cur || w.global.CompareAndSwap(cur, int64(a.Round)) {
				break
			}
		}
	case activateGroup:
		ranks, _, err := ButterflyGroup(w.cfg.Rank, len(w.cfg.Roster), w.cfg.GroupSize, int(a.Round))
		if err != nil {
			return nil, err
		}
		member := false
		for _, r := range ranks {
			member = member || w.cfg.Roster[r].Peer.ID == from
		}
		if !member {
			return nil, fmt.Errorf("averaging: %s is not in our group of round %d", from.ShortString(), a.Round)
		}
		w.startGroup(int(a.Round), false)
	}
	return nil, nil
}

// handleState serves a chunk of the current model to a joining peer.
func (w *Worker) handleState(ctx context.Context, from peer.ID, req []byte) ([]byte, error) {
	r, err := unmarshalStateRequest(req)
	if err != nil {
		return nil, err
	}
	snap := w.Snapshot()
	if r.Offset > uint64(len(snap)) || r.Count == 0 || r.Count > maxChunkElems {
		return nil, fmt.Errorf("%w: state range %d+%d of %d", ErrMessage, r.Offset, r.Count, len(snap))
	}
	end := min(uint64(len(snap)), r.Offset+uint64(r.Count))
	payload, err := wire.Marshal(tensor.FromSlice(snap[r.Offset:end], int(end-r.Offset)), wire.Options{})
	if err != nil {
		return nil, err
	}
	w.mu.Lock()
	round := w.round
	w.mu.Unlock()
	return marshalStateResponse(uint64(round), uint64(len(snap)), payload), nil
}

// LoadState replaces the worker's model (before Run), e.g. with one fetched
// by FetchState when joining late, and sets its round counter.
func (w *Worker) LoadState(vec []float32, round int) error {
	if len(vec) != w.n {
		return fmt.Errorf("averaging: state of %d parameters, model has %d", len(vec), w.n)
	}
	if w.running.Load() {
		return errors.New("averaging: worker is running")
	}
	unflattenValues(w.params, vec)
	w.mu.Lock()
	defer w.mu.Unlock()
	copy(w.published, vec)
	w.round = round
	return nil
}

// FetchState downloads a peer's current model over StateProtocol, chunk by
// chunk, for a peer that joins a run late; it returns the model and the
// round counter of the peer that served it. want is the expected length.
func FetchState(ctx context.Context, t p2p.Transport, from peer.AddrInfo, want int) ([]float32, int, error) {
	if want <= 0 || want > DefaultMaxElements {
		return nil, 0, fmt.Errorf("averaging: state of %d elements", want)
	}
	out := make([]float32, 0, want)
	round := 0
	for len(out) < want {
		n := min(want-len(out), DefaultChunkElems)
		resp, err := t.Call(ctx, from, StateProtocol, stateRequest{Offset: uint64(len(out)), Count: uint32(n)}.marshal())
		if err != nil {
			return nil, 0, fmt.Errorf("averaging: fetch state from %s: %w", from.ID.ShortString(), err)
		}
		r, total, payload, err := unmarshalStateResponse(resp)
		if err != nil {
			return nil, 0, err
		}
		if total != uint64(want) || r > math.MaxInt32 {
			return nil, 0, fmt.Errorf("%w: peer has %d parameters at round %d, want %d", ErrMessage, total, r, want)
		}
		x, err := decodeVector(payload, n)
		if err != nil {
			return nil, 0, err
		}
		out = append(out, x...)
		round = int(r)
	}
	return out, round, nil
}

// matchLoop runs MatchDHT: at every round boundary it forms a group
// through the DHT, averages the current model with it in the background
// and leaves the result as a correction for the training loop, as a WAGMA
// group round does. Rounds are skipped while one is still running.
func (w *Worker) matchLoop(ctx context.Context) {
	mm := w.mm
	for ctx.Err() == nil {
		r := mm.roundAt(time.Now()) + 1
		if err := sleepUntil(ctx, mm.start(r)); err != nil {
			return
		}
		w.mu.Lock()
		stepRound := w.round
		w.mu.Unlock()
		// Cancel a round that overruns into the next one's window.
		rctx, cancel := context.WithDeadline(ctx, mm.start(r+2))
		info := w.matchRound(rctx, r, stepRound)
		cancel()
		if ctx.Err() != nil {
			return
		}
		// List this peer for late joiners (off the round's critical path).
		actx, cancel := context.WithTimeout(ctx, mm.interval)
		err := mm.announce(actx, stepRound)
		cancel()
		w.mu.Lock()
		switch {
		case info.Err != nil && info.Members == nil, err != nil:
			w.stats.MatchErrors++
		case len(info.Members) < 2:
			w.stats.Alone++
		default:
			w.stats.Groups++
			w.stats.GroupMembers += len(info.Members)
		}
		w.mu.Unlock()
		if w.onGroup != nil && len(info.Members) > 0 {
			w.onGroup(info)
		}
	}
}

// matchRound forms the group of round r and averages with it.
func (w *Worker) matchRound(ctx context.Context, r, stepRound int) GroupInfo {
	info := GroupInfo{Round: r}
	sess, key, err := w.mm.form(ctx, r, stepRound)
	info.Key = key
	if err != nil {
		info.Err = err
		return info
	}
	for _, m := range sess.Members {
		info.Members = append(info.Members, m.Peer.ID)
	}
	if len(sess.Members) < 2 {
		return info
	}
	w.mu.Lock()
	snap := make([]float32, w.n)
	copy(snap, w.published)
	tensor.Axpy(1, w.delta, snap)
	w.mu.Unlock()
	avg := slices.Clone(snap)
	info.Result, info.Err = w.avg.AllReduce(ctx, sess, avg)
	if info.Err != nil || len(info.Result.Failed) > 0 || len(info.Result.Missing) > 0 {
		w.mu.Lock()
		w.stats.Failures++
		w.mu.Unlock()
	}
	if info.Err != nil && ctx.Err() != nil {
		return info
	}
	tensor.Axpy(-1, snap, avg)
	w.mu.Lock()
	tensor.Axpy(1, avg, w.delta)
	w.mu.Unlock()
	return info
}
