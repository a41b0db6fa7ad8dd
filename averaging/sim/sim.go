// Package sim runs a simulated swarm of group-averaging peers in one
// process: goroutine peers on p2p/memnet with emulated interfaces (NICLink)
// or on real libp2p hosts on loopback, each training its replica with its
// own loop and an optimizer.Optimizer, with device speed emulated by
// sleeping. Benchmarks and experiments use it; real swarms run one
// `skyhive peer` per process instead.
package sim

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/skyhive/skyhive/averaging"
	"github.com/skyhive/skyhive/averaging/optimizer"
	"github.com/skyhive/skyhive/data"
	"github.com/skyhive/skyhive/dht"
	"github.com/skyhive/skyhive/models"
	"github.com/skyhive/skyhive/netem"
	"github.com/skyhive/skyhive/nn"
	"github.com/skyhive/skyhive/optim"
	"github.com/skyhive/skyhive/p2p"
	"github.com/skyhive/skyhive/p2p/memnet"
	"github.com/skyhive/skyhive/profile"
	"github.com/skyhive/skyhive/tensor"
	"github.com/skyhive/skyhive/train"
	"github.com/skyhive/skyhive/wire"
)

// SimConfig describes a simulated swarm: Peers goroutine peers on an
// in-memory network whose interfaces are modelled by NICLink, each training
// a replica of Model on its shard of Train and averaging as Algo says.
// Device speed is emulated: a peer with slowdown f spends f×BaseStep per
// local step (sleeping whatever its real compute did not take), so the
// imbalance is the same however busy the host's cores are.
type SimConfig struct {
	Algo          optimizer.Algo
	Peers         int
	GroupSize     int
	Tau           int
	Period        int
	AverageModels bool

	Model    string        // a model spec of package models ("mlp")
	Train    *data.Dataset // sharded among the peers
	Test     *data.Dataset // evaluation set (nil: no evaluation)
	Batch    int
	LR       float64 // SGD learning rate
	Momentum float64

	// Slowdowns gives each peer's slowdown factor (≥ 1); nil means 1.
	Slowdowns []float64
	// BaseStep is the emulated time of one local step at slowdown 1.
	BaseStep time.Duration

	// Bandwidth (bit/s, 0 unlimited) and Latency of every peer's interface.
	Bandwidth float64
	Latency   time.Duration
	Codec     wire.Codec
	// Timeout bounds each all-reduce (Config.Timeout).
	Timeout time.Duration

	// Transport is TransportMemnet (default: goroutine peers on an
	// in-memory network with interfaces modelled by NICLink) or
	// TransportLibp2p (every peer a real libp2p host on loopback TCP with
	// TLS; Bandwidth and Latency are then ignored).
	Transport string
	// Matchmaking, RoundInterval, MatchWindow and GridDims configure how
	// WAGMA finds groups (see WorkerConfig). With MatchDHT every peer runs
	// a DHT node; they bootstrap from DHTSeeds if given (an external DHT,
	// libp2p only) and from the first peer otherwise.
	Matchmaking   averaging.Matchmaking
	RoundInterval time.Duration
	MatchWindow   time.Duration
	GridDims      int
	DHTSeeds      []peer.AddrInfo
	// RunID names the run in session IDs and DHT keys
	// (optimizer.DefaultRunID).
	RunID string

	// Duration stops the run (0: only Steps or ctx).
	Duration time.Duration
	// Steps stops each peer after this many local steps (0: no limit).
	Steps int
	// EvalEvery evaluates the mean of the peers' models on Test this often.
	EvalEvery time.Duration
	// Seed seeds the model, the shuffles and the data split.
	Seed uint64
	// OnStep, if set, is called after every local step of every peer.
	OnStep func(rank int, s optimizer.StepInfo, loss float64)
	// Final, if set, receives every peer's model at the end.
	Final func(rank int, model []float32)
	// Kill, if set, is called once the swarm is running with a function
	// that kills a peer by rank (for failure experiments).
	Kill func(ctx context.Context, kill func(rank int) error)
	// Metrics, if set, receives every peer's optimizer collector (and DHT
	// node's, with MatchDHT), labelled rank="I". Nil: no metrics.
	Metrics prometheus.Registerer
}

// EvalPoint is one evaluation of the swarm's mean model.
type EvalPoint struct {
	Seconds  float64 `json:"seconds"`
	Steps    int     `json:"steps"` // local steps summed over peers
	Accuracy float64 `json:"accuracy"`
	Loss     float64 `json:"loss"`
}

// SimResult is the outcome of Simulate.
type SimResult struct {
	Algo  optimizer.Algo `json:"algo"`
	Peers int            `json:"peers"`
	Curve []EvalPoint    `json:"curve"`
	// StepsPerSecond is the local steps per second per peer, averaged over
	// the peers (the swarm processes Peers×Batch×StepsPerSecond examples/s).
	StepsPerSecond float64           `json:"steps_per_second"`
	Seconds        float64           `json:"seconds"`
	FinalAccuracy  float64           `json:"final_accuracy"`
	Workers        []optimizer.Stats `json:"workers"`
	// Joined counts peers that started from a model fetched from a peer
	// of the run found in an external DHT (late joining).
	Joined int `json:"joined,omitempty"`
}

// DrawSlowdowns draws n slowdown factors from U[lo, hi] with a seed: the
// one draw of profile.DrawSlowdowns, on the averaging experiments' stream.
func DrawSlowdowns(n int, lo, hi float64, seed uint64) []float64 {
	return profile.DrawSlowdowns(n, lo, hi, seed, 0x51057)
}

// Simulate runs a simulated swarm and returns its curve and throughput.
func Simulate(ctx context.Context, cfg SimConfig) (SimResult, error) {
	res := SimResult{Algo: cfg.Algo, Peers: cfg.Peers}
	cfg, timeout, mm, err := checkSimConfig(cfg)
	if err != nil {
		return res, err
	}
	nw, err := newSimNetwork(ctx, cfg)
	if err != nil {
		return res, err
	}
	defer nw.close()
	sw := &simSwarm{cfg: cfg, nw: nw, mm: mm, timeout: timeout}
	defer sw.close()
	if err := sw.startPeers(ctx); err != nil {
		return res, err
	}
	if res.Joined, err = sw.startOptimizers(ctx); err != nil {
		return res, err
	}
	ev := &simEvaluator{sw: sw}
	if cfg.Test != nil {
		if ev.model, err = models.Build(cfg.Model, cfg.Seed); err != nil {
			return res, err
		}
	}
	// The first point is the initial model, before any peer steps.
	ev.start = time.Now()
	ev.evaluate()
	runCtx, cancel := context.WithCancel(ctx)
	if cfg.Duration > 0 {
		runCtx, cancel = context.WithTimeout(ctx, cfg.Duration)
	}
	defer cancel()
	stats, errs := sw.train(runCtx, ev)
	res.Seconds = time.Since(ev.start).Seconds()
	ev.evaluate()
	res.Curve = ev.curve
	if n := len(res.Curve); n > 0 {
		res.FinalAccuracy = res.Curve[n-1].Accuracy
	}
	res.Workers = stats
	if cfg.Final != nil {
		for i, st := range sw.peers {
			cfg.Final(i, st.opt.Snapshot())
		}
	}
	var rate float64
	for _, s := range stats {
		rate += float64(s.Steps) / res.Seconds
	}
	res.StepsPerSecond = rate / float64(cfg.Peers)
	return res, errors.Join(errs...)
}

// checkSimConfig validates cfg and fills its defaults; it returns the
// averaging timeout and the parsed matchmaking.
func checkSimConfig(cfg SimConfig) (SimConfig, time.Duration, averaging.Matchmaking, error) {
	switch {
	case cfg.Peers < 1:
		return cfg, 0, "", fmt.Errorf("averaging: %d peers", cfg.Peers)
	case cfg.Train == nil || cfg.Batch <= 0:
		return cfg, 0, "", errors.New("averaging: simulation needs training data and a batch size")
	case cfg.Duration <= 0 && cfg.Steps <= 0:
		return cfg, 0, "", errors.New("averaging: simulation needs a duration or a step count")
	case cfg.Slowdowns != nil && len(cfg.Slowdowns) != cfg.Peers:
		return cfg, 0, "", fmt.Errorf("averaging: %d slowdowns for %d peers", len(cfg.Slowdowns), cfg.Peers)
	}
	if cfg.Model == "" {
		cfg.Model = "mlp"
	}
	timeout := cfg.Timeout
	if timeout <= 0 {
		timeout = 20 * time.Second
	}
	mm, err := averaging.ParseMatchmaking(string(cfg.Matchmaking))
	if err != nil {
		return cfg, 0, "", err
	}
	if mm == averaging.MatchDHT && cfg.RoundInterval > 0 && cfg.Timeout <= 0 {
		timeout = cfg.RoundInterval
	}
	return cfg, timeout, mm, nil
}

// simPeer is one simulated peer: its transport, averager, optional DHT
// node, model replica, optimizer and compute step.
type simPeer struct {
	peer    p2p.Transport
	avg     *averaging.Averager
	node    *dht.Node
	model   *nn.Sequential
	opt     *optimizer.Optimizer
	compute computeFunc
}

// simSwarm holds the peers of one simulation and what close must release.
type simSwarm struct {
	cfg     SimConfig
	nw      *simNetwork
	mm      averaging.Matchmaking
	timeout time.Duration
	peers   []*simPeer
	roster  []averaging.Member
	closers []io.Closer // closed in reverse order
}

// close closes what the swarm opened, last opened first.
func (sw *simSwarm) close() {
	for _, c := range slices.Backward(sw.closers) {
		c.Close()
	}
}

// rankMetrics is peer i's registerer: an untyped nil without metrics.
func (sw *simSwarm) rankMetrics(i int) prometheus.Registerer {
	if sw.cfg.Metrics == nil {
		return nil
	}
	return prometheus.WrapRegistererWith(prometheus.Labels{"rank": strconv.Itoa(i)}, sw.cfg.Metrics)
}

// startPeers creates every peer's transport, averager and model, and with
// DHT matchmaking its DHT node, bootstrapped from the seeds and peer 0.
func (sw *simSwarm) startPeers(ctx context.Context) error {
	sw.peers = make([]*simPeer, sw.cfg.Peers)
	sw.roster = make([]averaging.Member, sw.cfg.Peers)
	for i := range sw.peers {
		p, err := sw.nw.newPeer(ctx)
		if err != nil {
			return err
		}
		a := averaging.New(p, averaging.Config{Codec: sw.cfg.Codec, Timeout: sw.timeout})
		sw.closers = append(sw.closers, a)
		model, err := models.Build(sw.cfg.Model, sw.cfg.Seed)
		if err != nil {
			return err
		}
		sw.peers[i] = &simPeer{peer: p, avg: a, model: model}
		sw.roster[i] = averaging.Member{Peer: p.AddrInfo(), Weight: 1}
		if sw.mm == averaging.MatchDHT {
			if err := sw.startDHT(ctx, i); err != nil {
				return err
			}
		}
	}
	return nil
}

// startDHT gives peer i a DHT node and bootstraps it.
func (sw *simSwarm) startDHT(ctx context.Context, i int) error {
	node, err := dht.New(sw.peers[i].peer, dht.Config{RPCTimeout: sw.timeout, Metrics: sw.rankMetrics(i)})
	if err != nil {
		return err
	}
	sw.closers = append(sw.closers, node)
	sw.peers[i].node = node
	seeds := sw.cfg.DHTSeeds
	if i > 0 {
		seeds = append(slices.Clone(seeds), sw.peers[0].peer.AddrInfo())
	}
	if len(seeds) > 0 {
		bctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		err := node.Bootstrap(bctx, seeds)
		cancel()
		if err != nil {
			return fmt.Errorf("averaging: peer %d: %w", i, err)
		}
	}
	return nil
}

// startOptimizers gives every peer its data shard, compute step and
// collaborative optimizer; it returns how many peers joined from the
// state of peers already training.
func (sw *simSwarm) startOptimizers(ctx context.Context) (joined int, err error) {
	cfg := sw.cfg
	shuffled, _, err := cfg.Train.Split(cfg.Train.Len(), cfg.Seed)
	if err != nil {
		return joined, err
	}
	for i, st := range sw.peers {
		shard, err := shuffled.Shard(i, cfg.Peers)
		if err != nil {
			return joined, err
		}
		loader, err := data.NewLoader(shard, data.BatchOptions{Size: cfg.Batch, Shuffle: true, Seed: cfg.Seed + uint64(i), DropLast: true})
		if err != nil {
			return joined, err
		}
		if loader.Len() == 0 {
			return joined, fmt.Errorf("averaging: shard of %d examples is smaller than a batch", shard.Len())
		}
		slow := 1.0
		if cfg.Slowdowns != nil {
			slow = max(cfg.Slowdowns[i], 1)
		}
		inner := optim.NewSGD(st.model.Params(), optim.SGDConfig{LR: cfg.LR, Momentum: cfg.Momentum})
		st.compute = newCompute(st.model, shard, loader, cfg.Batch, time.Duration(slow*float64(cfg.BaseStep)))
		o, err := optimizer.New(st.avg, inner, optimizer.Config{
			Algo: cfg.Algo, Rank: i, Roster: sw.roster, GroupSize: cfg.GroupSize, Tau: cfg.Tau,
			Period: cfg.Period, AverageModels: cfg.AverageModels, RunID: cfg.RunID,
			Matchmaking: sw.mm, DHT: st.node, RoundInterval: cfg.RoundInterval, MatchWindow: cfg.MatchWindow,
			GridDims: cfg.GridDims, Metrics: sw.rankMetrics(i),
		})
		if err != nil {
			return joined, err
		}
		sw.closers = append(sw.closers, o)
		st.opt = o
		if st.node != nil && len(cfg.DHTSeeds) > 0 {
			// Joining an external DHT: if peers of this run are already
			// training, start from their state instead of from scratch.
			jctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			_, err := o.Join(jctx, st.node, optimizer.DownloadConfig{})
			cancel()
			if err == nil {
				joined++
			}
		}
	}
	return joined, nil
}

// train runs every peer until its step count is reached or runCtx ends,
// evaluating every EvalEvery meanwhile and running Kill alongside; it
// returns each peer's statistics and error.
func (sw *simSwarm) train(runCtx context.Context, ev *simEvaluator) ([]optimizer.Stats, []error) {
	cfg := sw.cfg
	var wg sync.WaitGroup
	stats := make([]optimizer.Stats, cfg.Peers)
	errs := make([]error, cfg.Peers)
	for i, st := range sw.peers {
		wg.Go(func() {
			errs[i] = runPeer(runCtx, i, st.opt, st.compute, cfg.Steps, cfg.OnStep)
			stats[i] = st.opt.Stats()
		})
	}
	finished := make(chan struct{})
	go func() { wg.Wait(); close(finished) }()
	if cfg.Kill != nil {
		wg.Go(func() {
			cfg.Kill(runCtx, func(rank int) error {
				if rank < 0 || rank >= cfg.Peers {
					return fmt.Errorf("averaging: no rank %d", rank)
				}
				return sw.nw.kill(sw.peers[rank].peer.ID())
			})
		})
	}
	evalEvery := cfg.EvalEvery
	if evalEvery <= 0 {
		evalEvery = time.Hour
	}
	tick := time.NewTicker(evalEvery)
	defer tick.Stop()
	for {
		select {
		case <-tick.C:
			ev.evaluate()
		case <-finished:
			return stats, errs
		}
	}
}

// simEvaluator evaluates the mean model of the swarm's live peers.
type simEvaluator struct {
	sw    *simSwarm
	model *nn.Sequential // nil: no test set, no evaluation
	start time.Time
	curve []EvalPoint
}

// evaluate appends the mean live model's test loss and accuracy to the
// curve.
func (ev *simEvaluator) evaluate() {
	if ev.model == nil {
		return
	}
	ps, nw := ev.sw.peers, ev.sw.nw
	mean := make([]float32, ps[0].opt.Layout().Params)
	steps := 0
	for _, st := range ps {
		if !nw.alive(st.peer.ID()) {
			continue
		}
		tensor.Axpy(1, st.opt.Snapshot(), mean)
		steps += st.opt.Stats().Steps
	}
	alive := 0
	for _, st := range ps {
		if nw.alive(st.peer.ID()) {
			alive++
		}
	}
	tensor.Scale(1/float32(max(alive, 1)), mean)
	nn.SetFlatValues(ev.model.Params(), mean)
	loss, acc := train.Evaluate(ev.model, ev.sw.cfg.Test, 500)
	ev.curve = append(ev.curve, EvalPoint{Seconds: time.Since(ev.start).Seconds(), Steps: steps, Accuracy: acc, Loss: loss})
}

// Transports of a simulated swarm.
const (
	TransportMemnet = "memnet"
	TransportLibp2p = "libp2p"
)

// simNetwork creates the peers of a simulation and kills them.
type simNetwork struct {
	mem   *memnet.Network // memnet only
	mu    sync.Mutex
	hosts map[peer.ID]*p2p.Host // libp2p only
	dead  map[peer.ID]bool
}

func newSimNetwork(ctx context.Context, cfg SimConfig) (*simNetwork, error) {
	nw := &simNetwork{hosts: map[peer.ID]*p2p.Host{}, dead: map[peer.ID]bool{}}
	switch cfg.Transport {
	case "", TransportMemnet:
		if len(cfg.DHTSeeds) > 0 {
			return nil, errors.New("averaging: external DHT seeds need the libp2p transport")
		}
		link := netem.NewNICLink(cfg.Bandwidth, cfg.Latency)
		nw.mem = memnet.NewNetwork(memnet.WithLink(link), memnet.WithMaxInbound(256))
	case TransportLibp2p:
	default:
		return nil, fmt.Errorf("averaging: unknown transport %q (want memnet or libp2p)", cfg.Transport)
	}
	return nw, nil
}

func (nw *simNetwork) newPeer(ctx context.Context) (p2p.Transport, error) {
	if nw.mem != nil {
		return nw.mem.NewPeer()
	}
	h, err := p2p.New(ctx, p2p.Config{ListenAddrs: []string{"/ip4/127.0.0.1/tcp/0"}, IdleTimeout: 10 * time.Second})
	if err != nil {
		return nil, fmt.Errorf("averaging: start libp2p host: %w", err)
	}
	nw.mu.Lock()
	nw.hosts[h.ID()] = h
	nw.mu.Unlock()
	return h, nil
}

// kill makes a peer unreachable: killed on memnet, closed with libp2p.
func (nw *simNetwork) kill(id peer.ID) error {
	if nw.mem != nil {
		return nw.mem.Kill(id)
	}
	nw.mu.Lock()
	h, ok := nw.hosts[id]
	nw.dead[id] = true
	nw.mu.Unlock()
	if !ok {
		return fmt.Errorf("averaging: no peer %s", id.ShortString())
	}
	return h.Close()
}

func (nw *simNetwork) alive(id peer.ID) bool {
	if nw.mem != nil {
		return nw.mem.Alive(id)
	}
	nw.mu.Lock()
	defer nw.mu.Unlock()
	return !nw.dead[id]
}

func (nw *simNetwork) close() {
	if nw.mem != nil {
		nw.mem.Close()
		return
	}
	for _, h := range nw.hosts {
		h.Close()
	}
}

// computeFunc computes the gradients of a peer's parameters for its next
// batch (they are zeroed before) and returns the loss.
type computeFunc func(ctx context.Context) (loss float64, err error)

// runPeer is one simulated peer's training loop: compute, then Step, until
// ctx ends or steps (if positive) are done. It returns nil when ctx ends.
func runPeer(ctx context.Context, rank int, o *optimizer.Optimizer, compute computeFunc, steps int, onStep func(int, optimizer.StepInfo, float64)) error {
	for i := 0; steps <= 0 || i < steps; i++ {
		o.ZeroGrad()
		loss, err := compute(ctx)
		if err == nil {
			err = o.Step(ctx, 1)
		}
		if ctx.Err() != nil {
			return nil
		}
		if err != nil {
			return fmt.Errorf("peer %d: step %d: %w", rank, i, err)
		}
		if onStep != nil {
			onStep(rank, optimizer.StepInfo{Step: i + 1, Round: o.Round()}, loss)
		}
	}
	return nil
}

// newCompute returns a computeFunc that trains on the loader's batches and
// takes at least stepTime per call.
func newCompute(model *nn.Sequential, shard *data.Dataset, loader *data.Loader, batch int, stepTime time.Duration) computeFunc {
	var order []int
	epoch := 0
	return func(ctx context.Context) (float64, error) {
		t0 := time.Now()
		if len(order) < batch {
			order = loader.Order(epoch)
			epoch++
		}
		b := shard.Gather(order[:batch])
		order = order[batch:]
		logits, st := model.Forward(nn.Ctx{Train: true}, b.X)
		loss, dlogits := nn.SoftmaxCrossEntropy(logits, b.Y)
		model.Backward(st, dlogits)
		if d := stepTime - time.Since(t0); d > 0 {
			t := time.NewTimer(d)
			defer t.Stop()
			select {
			case <-t.C:
			case <-ctx.Done():
				return float64(loss), ctx.Err()
			}
		}
		return float64(loss), nil
	}
}
