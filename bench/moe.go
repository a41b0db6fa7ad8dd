package bench

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/skyhive/skyhive/dht"
	"github.com/skyhive/skyhive/moe"
	"github.com/skyhive/skyhive/moe/client"
	"github.com/skyhive/skyhive/moe/server"
	"github.com/skyhive/skyhive/moe/sim"
	"github.com/skyhive/skyhive/nn"
	"github.com/skyhive/skyhive/optim"
	"github.com/skyhive/skyhive/p2p"
	"github.com/skyhive/skyhive/tensor"
	"github.com/skyhive/skyhive/wire"
)

// Parameters of the moe suite.
const (
	moeRemoteHidden = 1024 // FFN expert of Learning@home's size
	moeTputHidden   = 128  // experts of the DMoE vs model-parallel comparison
	moeTputLayers   = 4
	moeTputTrainers = 16 // concurrent DMoE trainers
	moeTputBatch    = 64
	moeTputK        = 4
)

func moeSuite() Suite {
	return Suite{
		Name: "moe",
		Short: "remote FFN expert (hidden 1024, libp2p loopback) samples/s vs the same expert locally; " +
			"DMoE (16 concurrent trainers, top-4) vs a model-parallel pipeline of the same layers under 0-200 ms RTT",
		Run: runMoE,
	}
}

func runMoE(ctx context.Context, o Options) ([]Result, error) {
	ctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
	defer cancel()
	var rs []Result
	r1, err := moeRemoteVsLocal(ctx, o)
	if err != nil {
		return nil, err
	}
	rs = append(rs, r1...)
	r2, err := moeDMoEvsModelParallel(ctx, o)
	if err != nil {
		return nil, err
	}
	return append(rs, r2...), nil
}

// moeRemoteVsLocal measures one expert called over libp2p on loopback
// against the same expert run in this process, alternating the two.
func moeRemoteVsLocal(ctx context.Context, o Options) ([]Result, error) {
	hidden := moeRemoteHidden
	batches := []int{64, 128, 256, 512}
	reps := max(o.Reps, 5)
	if o.Quick {
		batches = []int{64, 512}
	}
	maxB := batches[len(batches)-1]
	reg := o.registerer()
	sh, err := p2p.New(ctx, p2p.Config{ListenAddrs: []string{"/ip4/127.0.0.1/tcp/0"}, MaxMessageBytes: 64 << 20, Metrics: reg})
	if err != nil {
		return nil, err
	}
	defer sh.Close()
	ch, err := p2p.New(ctx, p2p.Config{ListenAddrs: []string{"/ip4/127.0.0.1/tcp/0"}, MaxMessageBytes: 64 << 20, Metrics: reg})
	if err != nil {
		return nil, err
	}
	defer ch.Close()
	srv, err := server.New(server.Config{Transport: sh, Experts: []string{"ffn.0"}, Hidden: hidden, Seed: 1,
		MaxBatch: maxB, Limits: wire.Limits{MaxElements: 2 * maxB * hidden}, Metrics: reg})
	if err != nil {
		return nil, err
	}
	defer srv.Close()
	local := server.BuildExpert(server.TypeFFN, hidden, 1, rand.New(rand.NewPCG(0, 0)))
	if err := nn.ImportParams(local.Params(), srv.ExpertWeights("ffn.0")); err != nil {
		return nil, err
	}
	opt := optim.NewAdamW(local.Params(), optim.AdamWConfig{LR: 1e-9})
	remote := &client.RemoteExpert{UID: "ffn.0", Peer: sh.AddrInfo(), Transport: ch}
	var rs []Result
	for _, b := range batches {
		x := tensor.New(b, hidden)
		tensor.FillNormal(x.Data, rand.New(rand.NewPCG(uint64(b), 1)), 0, 1)
		dy := tensor.New(b, hidden)
		tensor.FillNormal(dy.Data, rand.New(rand.NewPCG(uint64(b), 2)), 0, 0.01)
		var callErr error
		// Forward only.
		tr, tl, err := TimeAlternating(ctx, reps, 2, func() {
			if _, _, err := remote.Forward(ctx, x); err != nil && callErr == nil {
				callErr = err
			}
		}, func() {
			local.Forward(nn.Ctx{}, x)
		})
		if err != nil {
			return nil, err
		}
		if callErr != nil {
			return nil, fmt.Errorf("moe bench: remote forward: %w", callErr)
		}
		rs = append(rs, tputResult("remote-ffn-forward", b, hidden, tr, tl))
		// Forward then backward (the server recomputes the forward pass and
		// applies AdamW; the local reference does the same work).
		tr, tl, err = TimeAlternating(ctx, reps, 1, func() {
			_, st, err := remote.Forward(ctx, x)
			if err == nil {
				_, err = remote.Backward(ctx, st, dy)
			}
			if err != nil && callErr == nil {
				callErr = err
			}
		}, func() {
			local.Forward(nn.Ctx{}, x)
			opt.ZeroGrad()
			_, st := local.Forward(nn.Ctx{Train: true}, x)
			local.Backward(st, dy)
			opt.Step()
		})
		if err != nil {
			return nil, err
		}
		if callErr != nil {
			return nil, fmt.Errorf("moe bench: remote backward: %w", callErr)
		}
		rs = append(rs, tputResult("remote-ffn-fwd+bwd", b, hidden, tr, tl))
		o.Logf("moe: batch %d: remote/local %.3f (forward), %.3f (forward+backward)", b, rs[len(rs)-2].Ratio, rs[len(rs)-1].Ratio)
	}
	return rs, nil
}

func tputResult(name string, batch, hidden int, remote, local []float64) Result {
	sr, sl := Summarize(remote), Summarize(local)
	r := Result{Suite: "moe", Case: fmt.Sprintf("%s/h%d/b%d", name, hidden, batch), Metric: "samples/s",
		Value: float64(batch) / sr.Median, Unit: "samples/s", Min: float64(batch) / sr.Max, Max: float64(batch) / sr.Min}
	r = r.WithBaseline("local", float64(batch)/sl.Median)
	r.Note = "libp2p TCP+TLS on loopback; ratio of medians, alternating A B"
	return r
}

// moeDMoEvsModelParallel compares, at each emulated RTT, many concurrent
// DMoE trainers against a model-parallel pipeline that sends one batch at a
// time through the same layers (one expert per layer), as in Learning@home's
// throughput figure.
func moeDMoEvsModelParallel(ctx context.Context, o Options) ([]Result, error) {
	rtts := []time.Duration{0, 50 * time.Millisecond, 100 * time.Millisecond, 200 * time.Millisecond}
	base := 1500 * time.Millisecond
	reps := max(o.Reps, 5)
	if o.Quick {
		rtts = []time.Duration{0, 100 * time.Millisecond}
		base = 600 * time.Millisecond
	}
	grids := make([]moe.Grid, moeTputLayers)
	for i := range grids {
		grids[i] = moe.Grid{Prefix: fmt.Sprintf("l%d", i), Size: []int{4, 4}}
	}
	var rs []Result
	reg := o.registerer() // labels each server and DHT node apart
	for _, rtt := range rtts {
		sw, err := sim.New(ctx, sim.Config{Grids: grids, Servers: 4, RTT: rtt,
			Server: server.Config{Hidden: moeTputHidden, Seed: 1, LR: 1e-4, DeclareEvery: time.Hour, Metrics: reg},
			DHT:    dht.Config{Metrics: reg}})
		if err != nil {
			return nil, err
		}
		mp, err := moeModelParallel(ctx, sw, grids, reps)
		if err != nil {
			sw.Close()
			return nil, err
		}
		// A DMoE step takes 8 round trips: windows must hold several.
		dm, err := moeDMoE(ctx, sw, grids, reps, base+8*rtt)
		sw.Close()
		if err != nil {
			return nil, err
		}
		smp, sdm := Summarize(mp), Summarize(dm)
		r := Result{Suite: "moe", Case: fmt.Sprintf("dmoe-vs-model-parallel/rtt%dms", rtt.Milliseconds()), Metric: "samples/s",
			Value: sdm.Median, Unit: "samples/s", Min: sdm.Min, Max: sdm.Max,
			Note: fmt.Sprintf("%d layers of FFN experts (hidden %d) on 4 memnet servers; DMoE: %d trainers x batch %d, top-%d of 16 per layer; model-parallel: 1 batch of %d in flight, 1 expert per layer",
				moeTputLayers, moeTputHidden, moeTputTrainers, moeTputBatch, moeTputK, moeTputBatch)}
		rs = append(rs, r.WithBaseline("model-parallel", smp.Median))
		o.Logf("moe: RTT %v: DMoE %.0f samples/s, model-parallel %.0f samples/s", rtt, sdm.Median, smp.Median)
	}
	return rs, nil
}

func moeBatch(seed uint64) (*tensor.Tensor, *tensor.Tensor) {
	x := tensor.New(moeTputBatch, moeTputHidden)
	tensor.FillNormal(x.Data, rand.New(rand.NewPCG(seed, 1)), 0, 1)
	dy := tensor.New(moeTputBatch, moeTputHidden)
	tensor.FillNormal(dy.Data, rand.New(rand.NewPCG(seed, 2)), 0, 0.01)
	return x, dy
}

// moeModelParallel returns the samples/s of reps sequential iterations
// through expert l{i}.0.0 of every layer, forward then backward.
func moeModelParallel(ctx context.Context, sw *sim.Swarm, grids []moe.Grid, reps int) ([]float64, error) {
	tr, d, err := sw.NewTrainer(ctx)
	if err != nil {
		return nil, err
	}
	var experts []*client.RemoteExpert
	for _, g := range grids {
		uid := moe.JoinUID(g.Prefix, []int{0, 0})
		items, err := d.Get(ctx, g.Prefix+".0.")
		if err != nil {
			return nil, fmt.Errorf("find %s: %w", uid, err)
		}
		info, err := moe.UnmarshalInfo(items["0"].Value)
		if err != nil {
			return nil, err
		}
		experts = append(experts, &client.RemoteExpert{UID: uid, Peer: info.Peer, Transport: tr})
	}
	x, dy := moeBatch(1)
	step := func() error {
		h := x
		var sts []any
		for _, e := range experts {
			y, st, err := e.Forward(ctx, h)
			if err != nil {
				return err
			}
			sts = append(sts, st)
			h = y
		}
		g := dy
		for i := len(experts) - 1; i >= 0; i-- {
			var err error
			if g, err = experts[i].Backward(ctx, sts[i], g); err != nil {
				return err
			}
		}
		return nil
	}
	if err := step(); err != nil { // warm-up
		return nil, err
	}
	var out []float64
	for range reps {
		t0 := time.Now()
		if err := step(); err != nil {
			return nil, err
		}
		out = append(out, float64(moeTputBatch)/time.Since(t0).Seconds())
	}
	return out, nil
}

// moeDMoE runs moeTputTrainers trainers, each stepping a stack of DMoE
// layers, and returns the samples/s completed in each of reps windows
// after a warm-up window.
func moeDMoE(ctx context.Context, sw *sim.Swarm, grids []moe.Grid, reps int, window time.Duration) ([]float64, error) {
	var stacks [][]*client.MixtureOfExperts
	for range moeTputTrainers {
		tr, d, err := sw.NewTrainer(ctx)
		if err != nil {
			return nil, err
		}
		var layers []*client.MixtureOfExperts
		for _, g := range grids {
			bs, err := client.NewBeamSearch(d, g, moeTputK, time.Hour)
			if err != nil {
				return nil, err
			}
			m, err := client.New(client.Config{In: moeTputHidden, Search: bs, Transport: tr, KBest: moeTputK, DeadFor: -1})
			if err != nil {
				return nil, err
			}
			layers = append(layers, m)
		}
		stacks = append(stacks, layers)
	}
	var done atomic.Int64
	var firstErr atomic.Value
	rctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	for i, layers := range stacks {
		x, dy := moeBatch(uint64(i + 2))
		wg.Go(func() {
			// Stagger the trainers so their steps do not finish in bursts.
			select {
			case <-time.After(time.Duration(i) * window / time.Duration(len(stacks))):
			case <-rctx.Done():
			}
			for rctx.Err() == nil {
				h := x
				var sts []nn.State
				var err error
				for _, l := range layers {
					var st nn.State
					if h, st, err = l.ForwardCtx(rctx, h); err != nil {
						break
					}
					sts = append(sts, st)
				}
				g := dy
				for j := len(sts) - 1; j >= 0 && err == nil; j-- {
					g, err = layers[j].BackwardCtx(rctx, sts[j], g)
				}
				if err != nil {
					if rctx.Err() == nil {
						firstErr.CompareAndSwap(nil, err)
					}
					continue
				}
				done.Add(moeTputBatch)
			}
		})
	}
	var out []float64
	select { // warm-up: fills the DHT caches and the pipeline
	case <-time.After(2 * window):
	case <-ctx.Done():
	}
	for range reps {
		n0, t0 := done.Load(), time.Now()
		select {
		case <-time.After(window):
		case <-ctx.Done():
		}
		out = append(out, float64(done.Load()-n0)/time.Since(t0).Seconds())
	}
	cancel()
	wg.Wait()
	if err, ok := firstErr.Load().(error); ok && err != nil {
		return out, fmt.Errorf("dmoe trainer: %w", err)
	}
	return out, nil
}
