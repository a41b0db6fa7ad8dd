package pipeline

import (
	"context"
	"fmt"
	"math"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/skyhive/skyhive/alloc"
	"github.com/skyhive/skyhive/netem"
	"github.com/skyhive/skyhive/p2p/memnet"
)

// TestSimulateSchedules checks the simulator against closed forms on a
// uniform pipeline without network costs: S stages whose ops take f
// (forward) and b (backward) per micro-batch run M micro-batches in
// (S−1)·(f+b) + M·(f+b) under GPipe and 1F1B, and S·M·(f+b) sequentially
// with one micro-batch of M times the size.
func TestSimulateSchedules(t *testing.T) {
	const S, M, f, b = 4, 8, 0.010, 0.020
	cm := &costModel{
		fwd:        map[int][]float64{4: {f, f, f, f}, 32: {M * f, M * f, M * f, M * f}},
		bwd:        map[int][]float64{4: {b, b, b, b}, 32: {M * b, M * b, M * b, M * b}},
		params:     make([]int64, S),
		outFloats:  []int64{8, 8, 8, 8},
		profBatch:  4,
		modelFLOPs: 1, refTotal: 1,
	}
	stages := make([]simStage, S)
	for k := range stages {
		stages[k] = simStage{first: k, last: k + 1, factor: 1}
	}
	sizes := make([]int, M)
	for i := range sizes {
		sizes[i] = 4
	}
	want := float64(S-1+M) * (f + b)
	for _, sched := range []Schedule{GPipe, OneFOneB} {
		if got := cm.simulate(stages, sched, sizes).Iteration; math.Abs(got-want) > 1e-9 {
			t.Errorf("%v: %.4f s, want %.4f", sched, got, want)
		}
	}
	if got, want := cm.simulate(stages, Sequential, []int{32}).Iteration, float64(S*M)*(f+b); math.Abs(got-want) > 1e-9 {
		t.Errorf("sequential: %.4f s, want %.4f", got, want)
	}
	// A link of latency λ between every pair adds 2λ per boundary to the
	// GPipe time (forward fill and backward drain).
	const lat = 0.005
	for k := range stages {
		stages[k].next = alloc.Link{Latency: lat}
	}
	if got, want := cm.simulate(stages, GPipe, sizes).Iteration, float64(S-1+M)*(f+b)+2*float64(S-1)*lat; math.Abs(got-want) > 1e-3 {
		// The last sender waits for its acknowledgement (another 2λ) after
		// its last message; allow that.
		if math.Abs(got-want-2*lat) > 1e-9 {
			t.Errorf("gpipe with latency: %.4f s, want %.4f", got, want)
		}
	}
}

// emulatedLat is the one-way latency between regions a and b in the
// emulated-link tests.
const emulatedLat = 15 * time.Millisecond

// twoRegions is a netem network of regions a and b, emulatedLat apart.
func twoRegions(t *testing.T) *netem.Network {
	t.Helper()
	prof := &netem.Profile{
		Regions: []string{"a", "b"},
		Intra:   netem.LinkParams{},
		Inter:   [][]netem.LinkParams{{{}, {Latency: emulatedLat}}, {{Latency: emulatedLat}, {}}},
	}
	n, err := netem.New(prof, 1)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// regionSession registers workers w0, w1, w2 in regions a, b, a with c
// (cfg gives each one's configuration), starts a GPipe session with one
// stage per worker in that order and checks that the measured a↔b link
// is no faster than the emulated latency. Measured times have no upper
// bound here: a loaded machine only makes them longer. The workers stop
// at the end of the test.
func regionSession(t *testing.T, c *Coordinator, cfg func(name, region string) WorkerConfig) *Session {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	var workers []*Worker
	t.Cleanup(func() {
		cancel()
		for _, w := range workers {
			w.Close()
		}
		wg.Wait()
	})
	for i, region := range []string{"a", "b", "a"} {
		wc := cfg(fmt.Sprintf("w%d", i), region)
		wc.Heartbeat = 200 * time.Millisecond
		w, err := NewWorker(ctx, wc)
		if err != nil {
			t.Fatal(err)
		}
		workers = append(workers, w)
		wg.Go(func() { w.Run(ctx) })
		wctx, wcancel := context.WithTimeout(ctx, 10*time.Second)
		err = c.WaitWorkers(wctx, i+1)
		wcancel()
		if err != nil {
			t.Fatal(err)
		}
	}
	plan := alloc.Plan{Stages: []alloc.Stage{{Device: 0, First: 0, Last: 4}, {Device: 1, First: 4, Last: 8}, {Device: 2, First: 8, Last: 11}}}
	s, err := c.Start(ctx, SessionConfig{Model: "deep-mlp:32x5", Seed: 1, Batch: 32, Micro: 4, Schedule: GPipe,
		Optim: OptimConfig{Kind: "sgd", LR: 0.05}, Plan: &plan, ProfileReps: 1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	if ab := s.links[regionPair("a", "b")]; ab.Latency < 0.9*emulatedLat.Seconds() {
		t.Errorf("measured a↔b latency %.1f ms, below the emulated %v", 1e3*ab.Latency, emulatedLat)
	}
	return s
}

// fastestIter runs n iterations and returns the fastest in seconds, after
// checking it against the time the link crossings impose: forward a→b→a
// and backward a→b→a cross the a↔b link four times, the commit round trip
// to b twice more.
func fastestIter(t *testing.T, s *Session, n int) float64 {
	t.Helper()
	var times []float64
	for _, b := range batches(t, blobs(t, 256, 2), 32, n) {
		st, err := s.Step(context.Background(), b)
		if err != nil {
			t.Fatal(err)
		}
		times = append(times, st.Seconds)
	}
	got := slices.Min(times[1:])
	if floor := 6 * emulatedLat.Seconds(); got < floor {
		t.Errorf("iteration took %.1f ms, below the %.1f ms the emulated links impose", 1e3*got, 1e3*floor)
	}
	return got
}

// TestEmulatedLinks is the package's one end-to-end test over libp2p (TCP
// on loopback); the others run on memnet. It trains over three in-process
// workers, each on its own host, whose traffic crosses netem routes
// (regions a, b, a with 15 ms between a and b), exercising registration
// through a route, address pinning, streamed activations and the
// proxies. It checks what does not depend on the machine's load: every
// route is shaped as the link between its peers' regions, the measured
// a↔b link and an iteration are no faster than the emulated latency
// allows, and the prediction counts the link crossings. Measured times
// have no upper bound: a loaded machine slows them without bound, and
// that is not a fault of the emulation.
func TestEmulatedLinks(t *testing.T) {
	if testing.Short() {
		t.Skip("emulated links take a few seconds")
	}
	c, err := NewCoordinator(context.Background(), CoordinatorConfig{Network: twoRegions(t), Region: "a"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	s := regionSession(t, c, func(name, region string) WorkerConfig {
		join, err := c.JoinAddr(name, region)
		if err != nil {
			t.Fatal(err)
		}
		return WorkerConfig{Name: name, Region: region, Join: join}
	})
	checkRoutes(t, c.routes.(*emulation))
	pred, err := s.Predict(s.Plan())
	if err != nil {
		t.Fatal(err)
	}
	// Forward a→b→a and backward a→b→a: the pipeline crosses the
	// measured a↔b link at least four times.
	if ab := s.links[regionPair("a", "b")]; pred.Pipeline < 4*ab.Latency {
		t.Errorf("predicted pipeline %.1f ms, below four crossings of the %.1f ms a↔b link", 1e3*pred.Pipeline, 1e3*ab.Latency)
	}
	got := fastestIter(t, s, 6)
	t.Logf("iteration %.1f ms, predicted %s", 1e3*got, pred)
}

// checkRoutes checks that the emulation routes the traffic between w0
// and w1 and between w1 and w2 (neighbouring stages in regions a and b)
// and that every route is shaped as the link between its ends' regions:
// the emulated latency between a and b, none within a region.
func checkRoutes(t *testing.T, e *emulation) {
	t.Helper()
	e.mu.Lock()
	defer e.mu.Unlock()
	for _, pair := range [][2]peer.ID{{"w0", "w1"}, {"w1", "w2"}} {
		if e.proxies[pair] == nil && e.proxies[[2]peer.ID{pair[1], pair[0]}] == nil {
			t.Errorf("no route between %s and %s", pair[0], pair[1])
		}
	}
	for key := range e.proxies {
		from, _ := e.n.Region(key[0])
		to, _ := e.n.Region(key[1])
		p, err := e.n.Params(key[0], key[1])
		if err != nil {
			t.Errorf("route %s→%s: %v", key[0], key[1], err)
			continue
		}
		want := time.Duration(0)
		if from != to {
			want = emulatedLat
		}
		if p.Latency != want {
			t.Errorf("route %s→%s (%s→%s) has latency %v, want %v", key[0], key[1], from, to, p.Latency, want)
		}
	}
}

// TestEmulatedLinksOnMemnet emulates the links as a transport wrapper:
// memnet delivers every message through a netem network (regions a, b, a;
// 15 ms between a and b), so the pipeline code sees a plain transport. The
// measured links must show the emulated latency, and an iteration must
// take at least the time the link crossings impose.
func TestEmulatedLinksOnMemnet(t *testing.T) {
	if testing.Short() {
		t.Skip("emulated links take a few seconds")
	}
	emu := twoRegions(t)
	net := memnet.NewNetwork(memnet.WithLink(emu))
	t.Cleanup(func() { net.Close() })
	newPeer := func(region string) *memnet.Peer {
		p, err := net.NewPeer()
		if err != nil {
			t.Fatal(err)
		}
		if err := emu.Assign(p.ID(), region); err != nil {
			t.Fatal(err)
		}
		return p
	}
	c, err := NewCoordinator(context.Background(), CoordinatorConfig{Transport: newPeer("a")})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	s := regionSession(t, c, func(name, region string) WorkerConfig {
		return WorkerConfig{Name: name, Region: region, Join: c.Addrs()[0], Transport: newPeer(region)}
	})
	fastestIter(t, s, 4)
}
