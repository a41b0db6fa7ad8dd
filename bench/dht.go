package bench

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/skyhive/skyhive/dht"
	"github.com/skyhive/skyhive/netem"
	"github.com/skyhive/skyhive/p2p/memnet"
)

// Parameters of the dht suite.
const (
	dhtKeys      = 200                    // keys stored before measuring
	dhtKillFrac  = 0.2                    // fraction of nodes killed without warning
	dhtOneWay    = 5 * time.Millisecond   // emulated one-way delay (10 ms RTT)
	dhtRPC       = 500 * time.Millisecond // RPC timeout of the nodes
	dhtParallel  = 16                     // concurrent client operations
	dhtJoinPar   = 4                      // nodes joining at once
	dhtBootstrap = 20                     // first nodes join one by one
)

func dhtSuite() Suite {
	return Suite{
		Name:  "dht",
		Short: "Kademlia over memnet: lookup hops vs log2(N)/alpha, get latency at 10 ms RTT vs hops x RTT, get success after killing 20% of nodes",
		Run:   runDHT,
	}
}

type dhtSwarm struct {
	net   *memnet.Network
	peers []*memnet.Peer
	nodes []*dht.Node
}

func (s *dhtSwarm) close() {
	for _, n := range s.nodes {
		if n != nil {
			n.Close()
		}
	}
	s.net.Close()
}

// buildDHT starts n nodes. The first ones join one by one; the rest join
// a few at a time, each through a random node that has already joined.
func buildDHT(ctx context.Context, n int, rng *rand.Rand, reg prometheus.Registerer) (*dhtSwarm, error) {
	s := &dhtSwarm{net: memnet.NewNetwork(memnet.WithBlackhole())}
	cfg := dht.Config{RPCTimeout: dhtRPC, RefreshInterval: -1, RepublishInterval: -1, CleanupInterval: -1, Metrics: reg}
	s.peers = make([]*memnet.Peer, n)
	s.nodes = make([]*dht.Node, n)
	for i := range n {
		p, err := s.net.NewPeer()
		if err != nil {
			s.close()
			return nil, err
		}
		c := cfg
		c.PrivKey = p.PrivKey()
		node, err := dht.New(p, c)
		if err != nil {
			s.close()
			return nil, err
		}
		s.peers[i], s.nodes[i] = p, node
	}
	seeds := make([]uint64, n)
	for i := range seeds {
		seeds[i] = rng.Uint64()
	}
	join := func(i, joined int) error {
		seed := s.peers[seeds[i]%uint64(joined)].AddrInfo()
		if err := s.nodes[i].Bootstrap(ctx, []peer.AddrInfo{seed}); err != nil {
			return fmt.Errorf("node %d: %w", i, err)
		}
		return nil
	}
	for i := 1; i < min(n, dhtBootstrap); i++ {
		if err := join(i, i); err != nil {
			s.close()
			return nil, err
		}
	}
	// Later nodes join in waves of dhtJoinPar through nodes of earlier waves.
	for start := dhtBootstrap; start < n; start += dhtJoinPar {
		var wg sync.WaitGroup
		errs := make([]error, dhtJoinPar)
		for j := 0; j < dhtJoinPar && start+j < n; j++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				errs[j] = join(start+j, start)
			}()
		}
		wg.Wait()
		if err := errors.Join(errs...); err != nil {
			s.close()
			return nil, err
		}
	}
	return s, nil
}

// parallelDo runs f(i) for i in [0, n) on dhtParallel goroutines.
func parallelDo(n int, f func(i int)) {
	var wg sync.WaitGroup
	next := make(chan int)
	for w := 0; w < dhtParallel; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				f(i)
			}
		}()
	}
	for i := 0; i < n; i++ {
		next <- i
	}
	close(next)
	wg.Wait()
}

func runDHT(ctx context.Context, o Options) ([]Result, error) {
	n := 1000
	if o.Quick {
		n = 100
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Minute)
	defer cancel()
	rng := rand.New(rand.NewPCG(42, uint64(n)))

	t0 := time.Now()
	s, err := buildDHT(ctx, n, rng, o.registerer())
	if err != nil {
		return nil, fmt.Errorf("dht bench: build: %w", err)
	}
	defer s.close()
	joinSec := time.Since(t0).Seconds()
	o.Logf("dht: %d nodes joined in %.1fs", n, joinSec)

	replicas, err := dhtStoreKeys(ctx, s, rng)
	if err != nil {
		return nil, err
	}
	if err := dhtSetDelay(s); err != nil {
		return nil, err
	}
	lk := dhtLookup(ctx, s, rng)
	churnLat, okAfter := dhtChurn(ctx, s, rng)
	return dhtResults(n, joinSec, replicas, lk, churnLat, okAfter), nil
}

// dhtStoreKeys stores dhtKeys keys from random nodes, instantly (no link
// delay), and returns how many replicas acknowledged each.
func dhtStoreKeys(ctx context.Context, s *dhtSwarm, rng *rand.Rand) ([]float64, error) {
	n := len(s.nodes)
	writers := make([]int, dhtKeys)
	for i := range writers {
		writers[i] = rng.IntN(n)
	}
	exp := time.Now().Add(time.Hour)
	var storeErr error
	var mu sync.Mutex
	replicas := make([]float64, dhtKeys)
	parallelDo(dhtKeys, func(i int) {
		k, err := s.nodes[writers[i]].Store(ctx, fmt.Sprintf("key-%d", i), "", fmt.Appendf(nil, "value-%d", i), exp)
		replicas[i] = float64(k)
		if err != nil {
			mu.Lock()
			storeErr = errors.Join(storeErr, err)
			mu.Unlock()
		}
	})
	if storeErr != nil {
		return nil, fmt.Errorf("dht bench: store: %w", storeErr)
	}
	return replicas, nil
}

// dhtSetDelay puts a 10 ms RTT on every link of the swarm.
func dhtSetDelay(s *dhtSwarm) error {
	link, err := netem.Delay(dhtOneWay)
	if err != nil {
		return err
	}
	for _, p := range s.peers {
		if err := link.Assign(p.ID(), netem.UniformRegion); err != nil {
			return err
		}
	}
	s.net.SetLink(link)
	return nil
}

// dhtLookups is what dhtLookup measures per key.
type dhtLookups struct {
	findHops, findRPCs []float64 // FIND_NODE referral depth and RPCs
	getHops, getLat    []float64 // Get referral depth and latency (s)
	ok                 int       // Gets that returned the stored value
}

// dhtLookup looks every key up from random nodes, first its closest peers
// and then its value.
func dhtLookup(ctx context.Context, s *dhtSwarm, rng *rand.Rand) dhtLookups {
	n := len(s.nodes)
	readers := make([]int, dhtKeys)
	for i := range readers {
		readers[i] = rng.IntN(n)
	}
	lk := dhtLookups{
		findHops: make([]float64, dhtKeys),
		findRPCs: make([]float64, dhtKeys),
		getHops:  make([]float64, dhtKeys),
		getLat:   make([]float64, dhtKeys),
	}
	getOK := make([]bool, dhtKeys)
	parallelDo(dhtKeys, func(i int) {
		key := fmt.Sprintf("key-%d", i)
		_, st, err := s.nodes[readers[i]].ClosestPeers(ctx, key)
		if err == nil {
			lk.findHops[i], lk.findRPCs[i] = float64(st.Hops), float64(st.Queries)
		}
		t := time.Now()
		items, st, err := s.nodes[readers[(i+1)%dhtKeys]].GetStats(ctx, key)
		lk.getLat[i] = time.Since(t).Seconds()
		lk.getHops[i] = float64(st.Hops)
		getOK[i] = err == nil && string(items[""].Value) == fmt.Sprintf("value-%d", i)
	})
	lk.ok = countTrue(getOK)
	return lk
}

// dhtChurn kills 20% of the nodes without warning (calls to them hang
// until the RPC timeout), then reads every key from a live node; it
// returns the latencies and how many reads found the value.
func dhtChurn(ctx context.Context, s *dhtSwarm, rng *rand.Rand) ([]float64, int) {
	n := len(s.nodes)
	dead := make(map[int]bool)
	for _, i := range rng.Perm(n)[:int(dhtKillFrac*float64(n))] {
		dead[i] = true
		_ = s.net.Kill(s.peers[i].ID())
	}
	live := make([]int, 0, n)
	for i := range n {
		if !dead[i] {
			live = append(live, i)
		}
	}
	churnLat := make([]float64, dhtKeys)
	churnOK := make([]bool, dhtKeys)
	parallelDo(dhtKeys, func(i int) {
		key := fmt.Sprintf("key-%d", i)
		t := time.Now()
		items, _, err := s.nodes[live[(i*7919)%len(live)]].GetStats(ctx, key)
		churnLat[i] = time.Since(t).Seconds()
		churnOK[i] = err == nil && string(items[""].Value) == fmt.Sprintf("value-%d", i)
	})
	return churnLat, countTrue(churnOK)
}

// dhtResults summarizes the DHT suite's measurements of an n-node swarm.
func dhtResults(n int, joinSec float64, replicas []float64, lk dhtLookups, churnLat []float64, okAfter int) []Result {
	cs := fmt.Sprintf("N=%d", n)
	rtt := 2 * dhtOneWay.Seconds()
	log2n := math.Log2(float64(n))
	hops := Summarize(lk.findHops)
	gh := Summarize(lk.getHops)
	lat := Summarize(lk.getLat)
	clat := Summarize(churnLat)
	rpcs := Summarize(lk.findRPCs)
	reps := Summarize(replicas)
	return []Result{
		Result{Suite: "dht", Case: cs, Metric: "lookup_hops", Value: hops.Median, Unit: "hops", Min: hops.Min, Max: hops.Max,
			Note: fmt.Sprintf("FIND_NODE referral depth to the closest peer, k=20 alpha=3, %d lookups; log2(N)=%.2f", dhtKeys, log2n)}.
			WithBaseline("log2(N)/alpha", log2n/3),
		Result{Suite: "dht", Case: cs, Metric: "lookup_rpcs", Value: rpcs.Median, Unit: "RPCs", Min: rpcs.Min, Max: rpcs.Max,
			Note: "RPCs per FIND_NODE lookup until the 20 closest answered"},
		Result{Suite: "dht", Case: cs, Metric: "get_hops", Value: gh.Median, Unit: "hops", Min: gh.Min, Max: gh.Max,
			Note: "referral depth to the first replica holding the value"}.WithBaseline("log2(N)/alpha", log2n/3),
		Result{Suite: "dht", Case: cs + "/rtt=10ms", Metric: "get_latency", Value: lat.Median * 1e3, Unit: "ms", Min: lat.Min * 1e3, Max: lat.Max * 1e3,
			Note: "Get until 3 replicas answered; baseline = median get hops x RTT"}.WithBaseline("hops*RTT", gh.Median*rtt*1e3),
		Result{Suite: "dht", Case: cs, Metric: "get_success", Value: 100 * float64(lk.ok) / dhtKeys, Unit: "%",
			Note: fmt.Sprintf("%d keys, median %.0f replicas acknowledged each store", dhtKeys, reps.Median)}.WithBaseline("all", 100),
		Result{Suite: "dht", Case: cs + "/killed=20%", Metric: "get_success", Value: 100 * float64(okAfter) / dhtKeys, Unit: "%",
			Note: "after killing 20% of nodes without warning, no repair or republish"}.WithBaseline("all", 100),
		Result{Suite: "dht", Case: cs + "/killed=20%/rtt=10ms", Metric: "get_latency", Value: clat.Median * 1e3, Unit: "ms", Min: clat.Min * 1e3, Max: clat.Max * 1e3,
			Note: fmt.Sprintf("dead peers cost a %v RPC timeout", dhtRPC)}.WithBaseline("no churn", lat.Median*1e3),
		Result{Suite: "dht", Case: cs, Metric: "join_time", Value: joinSec / float64(n) * 1e3, Unit: "ms/node",
			Note: "ping + self lookup + bucket refresh per node, in-process, no link delay"},
	}
}

func countTrue(bs []bool) int {
	c := 0
	for _, b := range bs {
		if b {
			c++
		}
	}
	return c
}
