package averaging

import (
	"context"
	"math"
	"sync"
	"testing"
	"time"

	"github.com/skyhive/skyhive/p2p"
)

// newHosts starts n libp2p hosts on loopback TCP.
func newHosts(t *testing.T, n int) []*p2p.Host {
	t.Helper()
	hs := make([]*p2p.Host, n)
	for i := range hs {
		h, err := p2p.New(context.Background(), p2p.Config{ListenAddrs: []string{"/ip4/127.0.0.1/tcp/0"}})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { h.Close() })
		hs[i] = h
	}
	return hs
}

func TestAllReduceOverLibp2p(t *testing.T) {
	const n, elems = 4, 3 << 20 / 4 * 4 // 12 MiB of float32
	hs := newHosts(t, n)
	avgs := make([]*Averager, n)
	ms := make([]Member, n)
	for i, h := range hs {
		avgs[i] = New(h, Config{Timeout: 60 * time.Second})
		t.Cleanup(func() { avgs[i].Close() })
		ms[i] = Member{Peer: h.AddrInfo(), Weight: 1}
	}
	vs := randomVectors(n, elems, 11)
	want := exactMean(vs)
	for round := range 2 { // the second round reuses the connections
		sess := Session{ID: "libp2p/" + string(rune('a'+round)), Members: ms}
		res := make([]Result, n)
		errs := make([]error, n)
		var wg sync.WaitGroup
		start := time.Now()
		for i := range n {
			wg.Go(func() { res[i], errs[i] = avgs[i].AllReduce(context.Background(), sess, vs[i]) })
		}
		wg.Wait()
		t.Logf("round %d: %d MiB among %d hosts in %v", round, elems*4>>20, n, time.Since(start))
		for i := range n {
			if errs[i] != nil || len(res[i].Failed) > 0 || len(res[i].Missing) > 0 || res[i].Contributors != n {
				t.Fatalf("host %d: %+v %v", i, res[i], errs[i])
			}
		}
	}
	// After two rounds every member holds the mean (the mean of equal
	// vectors is the vector itself).
	for i := range n {
		for j, x := range vs[i] {
			if math.Abs(float64(x)-want[j]) > 1e-4*(1+math.Abs(want[j])) {
				t.Fatalf("host %d element %d = %v, want %v", i, j, x, want[j])
			}
		}
	}
}
