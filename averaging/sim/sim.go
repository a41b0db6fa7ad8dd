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
	"math/rand/v2"
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

// DrawSlowdowns draws n slowdown factors from U[lo, hi] with a seed.
func DrawSlowdowns(n int, lo, hi float64, seed uint64) []float64 {
	rng := rand.New(rand.NewPCG(seed, 0x51057))
	s := make([]float64, n)
	for i := range s {
		s[i] = lo + (hi-lo)*rng.Float64()
	}
	return s
}

// Simulate runs a simulated swarm and returns its curve and throughput.
func Simulate(ctx context.Context, cfg SimConfig) (SimResult, error) {
	res := SimResult{Algo: cfg.Algo, Peers: cfg.Peers}
	switch {
	case cfg.Peers < 1:
		return res, fmt.Errorf("averaging: %d peers", cfg.Peers)
	case cfg.Train == nil || cfg.Batch <= 0:
		return res, errors.New("averaging: simulation needs training data and a batch size")
	case cfg.Duration <= 0 && cfg.Steps <= 0:
		return res, errors.New("averaging: simulation needs a duration or a step count")
	case cfg.Slowdowns != nil && len(cfg.Slowdowns) != cfg.Peers:
		return res, fmt.Errorf("averaging: %d slowdowns for %d peers", len(cfg.Slowdowns), cfg.Peers)
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
		return res, err
	}
	if mm == averaging.MatchDHT && cfg.RoundInterval > 0 && cfg.Timeout <= 0 {
		timeout = cfg.RoundInterval
	}
	nw, err := newSimNetwork(ctx, cfg)
	if err != nil {
		return res, err
	}
	defer nw.close()

	type peerState struct {
		peer    p2p.Transport
		avg     *averaging.Averager
		node    *dht.Node
		model   *nn.Sequential
		opt     *optimizer.Optimizer
		compute computeFunc
	}
	ps := make([]*peerState, cfg.Peers)
	roster := make([]averaging.Member, cfg.Peers)
	// rankMetrics is peer i's registerer: an untyped nil without metrics.
	rankMetrics := func(i int) prometheus.Registerer {
		if cfg.Metrics == nil {
			return nil
		}
		return prometheus.WrapRegistererWith(prometheus.Labels{"rank": strconv.Itoa(i)}, cfg.Metrics)
	}
	for i := range ps {
		p, err := nw.newPeer(ctx)
		if err != nil {
			return res, err
		}
		a := averaging.New(p, averaging.Config{Codec: cfg.Codec, Timeout: timeout})
		defer a.Close()
		model, err := models.Build(cfg.Model, cfg.Seed)
		if err != nil {
			return res, err
		}
		ps[i] = &peerState{peer: p, avg: a, model: model}
		roster[i] = averaging.Member{Peer: p.AddrInfo(), Weight: 1}
		if mm == averaging.MatchDHT {
			node, err := dht.New(p, dht.Config{RPCTimeout: timeout, Metrics: rankMetrics(i)})
			if err != nil {
				return res, err
			}
			defer node.Close()
			ps[i].node = node
			seeds := cfg.DHTSeeds
			if i > 0 {
				seeds = append(slices.Clone(seeds), ps[0].peer.AddrInfo())
			}
			if len(seeds) > 0 {
				bctx, cancel := context.WithTimeout(ctx, 30*time.Second)
				err := node.Bootstrap(bctx, seeds)
				cancel()
				if err != nil {
					return res, fmt.Errorf("averaging: peer %d: %w", i, err)
				}
			}
		}
	}
	shuffled, _, err := cfg.Train.Split(cfg.Train.Len(), cfg.Seed)
	if err != nil {
		return res, err
	}
	for i, st := range ps {
		shard, err := shuffled.Shard(i, cfg.Peers)
		if err != nil {
			return res, err
		}
		loader, err := data.NewLoader(shard, data.BatchOptions{Size: cfg.Batch, Shuffle: true, Seed: cfg.Seed + uint64(i), DropLast: true})
		if err != nil {
			return res, err
		}
		if loader.Len() == 0 {
			return res, fmt.Errorf("averaging: shard of %d examples is smaller than a batch", shard.Len())
		}
		slow := 1.0
		if cfg.Slowdowns != nil {
			slow = max(cfg.Slowdowns[i], 1)
		}
		inner := optim.NewSGD(st.model.Params(), optim.SGDConfig{LR: cfg.LR, Momentum: cfg.Momentum})
		st.compute = newCompute(st.model, shard, loader, cfg.Batch, time.Duration(slow*float64(cfg.BaseStep)))
		o, err := optimizer.New(st.avg, inner, optimizer.Config{
			Algo: cfg.Algo, Rank: i, Roster: roster, GroupSize: cfg.GroupSize, Tau: cfg.Tau,
			Period: cfg.Period, AverageModels: cfg.AverageModels, RunID: cfg.RunID,
			Matchmaking: mm, DHT: st.node, RoundInterval: cfg.RoundInterval, MatchWindow: cfg.MatchWindow,
			GridDims: cfg.GridDims, Metrics: rankMetrics(i),
		})
		if err != nil {
			return res, err
		}
		defer o.Close()
		st.opt = o
		if st.node != nil && len(cfg.DHTSeeds) > 0 {
			// Joining an external DHT: if peers of this run are already
			// training, start from their state instead of from scratch.
			jctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			_, err := o.Join(jctx, st.node, optimizer.DownloadConfig{})
			cancel()
			if err == nil {
				res.Joined++
			}
		}
	}

	var start time.Time
	var evalModel *nn.Sequential
	if cfg.Test != nil {
		if evalModel, err = models.Build(cfg.Model, cfg.Seed); err != nil {
			return res, err
		}
	}
	evaluate := func() {
		if evalModel == nil {
			return
		}
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
		nn.SetFlatValues(evalModel.Params(), mean)
		loss, acc := train.Evaluate(evalModel, cfg.Test, 500)
		res.Curve = append(res.Curve, EvalPoint{Seconds: time.Since(start).Seconds(), Steps: steps, Accuracy: acc, Loss: loss})
	}
	// The first point is the initial model, before any peer steps.
	start = time.Now()
	evaluate()
	runCtx, cancel := context.WithCancel(ctx)
	if cfg.Duration > 0 {
		runCtx, cancel = context.WithTimeout(ctx, cfg.Duration)
	}
	defer cancel()
	var wg sync.WaitGroup
	stats := make([]optimizer.Stats, cfg.Peers)
	errs := make([]error, cfg.Peers)
	for i, st := range ps {
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
				return nw.kill(ps[rank].peer.ID())
			})
		})
	}
	evalEvery := cfg.EvalEvery
	if evalEvery <= 0 {
		evalEvery = time.Hour
	}
	tick := time.NewTicker(evalEvery)
	defer tick.Stop()
loop:
	for {
		select {
		case <-tick.C:
			evaluate()
		case <-finished:
			break loop
		}
	}
	res.Seconds = time.Since(start).Seconds()
	evaluate()
	if n := len(res.Curve); n > 0 {
		res.FinalAccuracy = res.Curve[n-1].Accuracy
	}
	res.Workers = stats
	if cfg.Final != nil {
		for i, st := range ps {
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
