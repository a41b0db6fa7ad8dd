package bench

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/skyhive/skyhive/averaging"
	"github.com/skyhive/skyhive/averaging/optimizer"
	"github.com/skyhive/skyhive/averaging/sim"
	"github.com/skyhive/skyhive/data"
	"github.com/skyhive/skyhive/netem"
	"github.com/skyhive/skyhive/p2p/memnet"
	"github.com/skyhive/skyhive/wire"
)

// Parameters of the averaging suite.
const (
	avgBandwidth = 1e9                    // bit/s of every emulated interface
	avgBaseStep  = 100 * time.Millisecond // emulated step time at slowdown 1
	avgLatency   = 1 * time.Millisecond   // one-way latency of the emulated interfaces
	avgTimeout   = 60 * time.Second       // all-reduce timeout (nothing fails here)
	avgTau       = 10                     // WAGMA staleness bound
)

func averagingSuite() Suite {
	return Suite{
		Name: "averaging",
		Short: "group all-reduce time over emulated 1 Gbit/s interfaces vs the bound 2(n-1)/n*S/B; " +
			"WAGMA vs all-reduce SGD steps/s with peer speeds from U[1,4]",
		Run: runAveraging,
	}
}

type avgCase struct {
	mib, n int
	codec  wire.Codec
	bws    []float64 // per-peer bandwidth factors; nil = all 1
}

func runAveraging(ctx context.Context, o Options) ([]Result, error) {
	reps := max(o.Reps, 5)
	cases := []avgCase{{16, 8, wire.CodecNone, nil}, {64, 4, wire.CodecNone, nil}, {256, 2, wire.CodecNone, nil},
		{64, 4, wire.CodecFP16, nil}, {64, 4, wire.CodecNone, []float64{2, 1, 1, 0.5}}}
	peersList := []int{16, 32}
	runFor, tputReps := 3500*time.Millisecond, 3
	if o.Quick {
		reps = max(o.Reps, 3)
		cases = []avgCase{{16, 4, wire.CodecNone, nil}, {16, 4, wire.CodecNone, []float64{2, 1, 1, 0.5}}}
		peersList = []int{16}
		runFor, tputReps = 2*time.Second, 2
	}
	var out []Result
	for _, c := range cases {
		rs, err := benchAllReduce(ctx, o, c, reps)
		if err != nil {
			return out, err
		}
		out = append(out, rs...)
	}
	for _, p := range peersList {
		r, err := benchThroughput(ctx, o, p, max(o.Reps, tputReps), runFor)
		if err != nil {
			return out, err
		}
		out = append(out, r)
	}
	return out, nil
}

// benchAllReduce times one all-reduce of c.mib MiB among c.n memnet peers
// whose interfaces are modelled by netem.NICLink.
func benchAllReduce(ctx context.Context, o Options, c avgCase, reps int) ([]Result, error) {
	elems := c.mib << 18
	link := netem.NewNICLink(avgBandwidth, avgLatency)
	network := memnet.NewNetwork(memnet.WithLink(link))
	defer network.Close()
	avgs := make([]*averaging.Averager, c.n)
	members := make([]averaging.Member, c.n)
	equal := make([]averaging.Member, c.n)
	minBW := 1.0
	for i := range avgs {
		p, err := network.NewPeer()
		if err != nil {
			return nil, err
		}
		avgs[i] = averaging.New(p, averaging.Config{Codec: c.codec, Timeout: avgTimeout})
		defer avgs[i].Close()
		f := 1.0
		if c.bws != nil {
			f = c.bws[i]
			link.SetBandwidth(p.ID(), f*avgBandwidth)
		}
		minBW = min(minBW, f)
		members[i] = averaging.Member{Peer: p.AddrInfo(), Weight: f}
		equal[i] = averaging.Member{Peer: p.AddrInfo(), Weight: 1}
	}
	vecs := make([][]float32, c.n)
	rng := rand.New(rand.NewPCG(uint64(c.mib), uint64(c.n)))
	for i := range vecs {
		vecs[i] = make([]float32, elems)
		for j := range vecs[i] {
			vecs[i][j] = float32(rng.NormFloat64())
		}
	}
	run := 0
	var runErr error
	allReduce := func(ms []averaging.Member) func() {
		return func() {
			run++
			s := averaging.Session{ID: fmt.Sprintf("bench/%d", run), Members: ms}
			var wg sync.WaitGroup
			errs := make([]error, c.n)
			for i := range avgs {
				wg.Go(func() { _, errs[i] = avgs[i].AllReduce(ctx, s, vecs[i]) })
			}
			wg.Wait()
			for _, err := range errs {
				if err != nil && runErr == nil {
					runErr = err
				}
			}
		}
	}
	name := fmt.Sprintf("%dMiB/n=%d", c.mib, c.n)
	o.Logf("averaging: all-reduce %s codec %s", name, c.codec)
	if c.bws != nil {
		// Bandwidth-aware split against an even split on the same peers.
		tw, te, err := TimeAlternating(ctx, reps, 1, allReduce(members), allReduce(equal))
		if err != nil {
			return nil, err
		}
		if runErr != nil {
			return nil, runErr
		}
		w, e := Summarize(tw), Summarize(te)
		r := Result{Suite: "averaging", Case: name + "/bw=" + fmt.Sprint(c.bws), Metric: "allreduce_time_weighted",
			Value: w.Median, Unit: "s", Min: w.Min, Max: w.Max,
			Note: "split in proportion to bandwidth vs an even split; ratio < 1 means the weighted split is faster"}
		return []Result{r.WithBaseline("even_split", e.Median)}, nil
	}
	ts, _, err := TimeAlternating(ctx, reps, 1, allReduce(members), nil)
	if err != nil {
		return nil, err
	}
	if runErr != nil {
		return nil, runErr
	}
	s := Summarize(ts)
	bytes := float64(elems) * 4
	if c.codec == wire.CodecFP16 {
		bytes /= 2
	}
	bound := 2 * float64(c.n-1) / float64(c.n) * bytes * 8 / (avgBandwidth * minBW)
	r := Result{Suite: "averaging", Case: name + "/" + c.codec.String(), Metric: "allreduce_time",
		Value: s.Median, Unit: "s", Min: s.Min, Max: s.Max,
		Note: "bound 2(n-1)/n*S/B over the bytes on the wire, B = 1 Gbit/s per interface"}
	return []Result{r.WithBaseline("bandwidth_bound", bound)}, nil
}

// benchThroughput compares WAGMA with all-reduce SGD in local steps per
// second per peer, alternating runs.
func benchThroughput(ctx context.Context, o Options, peers, reps int, runFor time.Duration) (Result, error) {
	ds, err := data.GaussianBlobs(peers*64, data.ImageSize, data.NumClasses, 11)
	if err != nil {
		return Result{}, err
	}
	slow := sim.DrawSlowdowns(peers, 1, 4, 7)
	// Emulated time scales with the swarm so that all peers' real compute
	// and copying fit on the host's cores (a step is ~1 ms of real work).
	baseStep := avgBaseStep * time.Duration(max(peers/16, 1))
	var runErr error
	measure := func(algo optimizer.Algo, out *[]float64) func() {
		return func() {
			cfg := sim.SimConfig{Algo: algo, Peers: peers, Tau: avgTau, Model: "mlp-small", Train: ds,
				Batch: 32, LR: 0.01, Momentum: 0.9, Slowdowns: slow, BaseStep: baseStep,
				Bandwidth: avgBandwidth, Latency: avgLatency, Timeout: avgTimeout, Duration: runFor, Seed: 1,
				Metrics: o.registerer()}
			res, err := sim.Simulate(ctx, cfg)
			if err != nil && runErr == nil {
				runErr = err
			}
			*out = append(*out, res.StepsPerSecond)
		}
	}
	var wag, ar []float64
	o.Logf("averaging: throughput with %d peers", peers)
	if _, _, err := TimeAlternating(ctx, reps, 0, measure(optimizer.WAGMA, &wag), measure(optimizer.AllReduce, &ar)); err != nil {
		return Result{}, err
	}
	if runErr != nil {
		return Result{}, runErr
	}
	w, a := Summarize(wag), Summarize(ar)
	r := Result{Suite: "averaging", Case: fmt.Sprintf("throughput/P=%d", peers), Metric: "wagma_steps_per_s",
		Value: w.Median, Unit: "steps/s/peer", Min: w.Min, Max: w.Max,
		Note: fmt.Sprintf("S=%d tau=%d, speeds U[1,4] x %v, all-reduce SGD median %.3g (min %.3g max %.3g)",
			averaging.DefaultGroupSize(peers), avgTau, baseStep, a.Median, a.Min, a.Max)}
	return r.WithBaseline("allreduce_sgd", a.Median), nil
}
