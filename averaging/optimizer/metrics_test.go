package optimizer

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/skyhive/skyhive/averaging"
	"github.com/skyhive/skyhive/nn"
	"github.com/skyhive/skyhive/p2p/memnet"
)

// gathered returns each metric of reg by family name: a counter's or
// gauge's value, a histogram's count (unlabelled families, and the sum
// over a family's labels).
func gathered(t *testing.T, reg prometheus.Gatherer) map[string]float64 {
	t.Helper()
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, f := range fams {
		for _, m := range f.GetMetric() {
			switch {
			case m.Counter != nil:
				out[f.GetName()] += m.GetCounter().GetValue()
			case m.Gauge != nil:
				out[f.GetName()] += m.GetGauge().GetValue()
			case m.Histogram != nil:
				out[f.GetName()] += float64(m.GetHistogram().GetSampleCount())
			}
		}
	}
	return out
}

func TestOptimizerMetrics(t *testing.T) {
	const peers = 4
	net := memnet.NewNetwork()
	defer net.Close()
	var roster []averaging.Member
	var ps []*memnet.Peer
	for range peers {
		p, err := net.NewPeer()
		if err != nil {
			t.Fatal(err)
		}
		ps = append(ps, p)
		roster = append(roster, averaging.Member{Peer: p.AddrInfo(), Weight: 1})
	}
	regs := make([]*prometheus.Registry, peers)
	opts := make([]*Optimizer, peers)
	for i := range peers {
		a := averaging.New(ps[i], averaging.Config{Timeout: 5 * time.Second, ChunkElems: 1000})
		defer a.Close()
		regs[i] = prometheus.NewRegistry()
		o, err := New(a, noopOpt{[]*nn.Param{vecParam(mmElems, float32(i), uint64(i))}},
			Config{Algo: WAGMA, Rank: i, Roster: roster, GroupSize: 2, Tau: 4, Metrics: regs[i]})
		if err != nil {
			t.Fatal(err)
		}
		defer o.Close()
		opts[i] = o
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	for _, o := range opts {
		wg.Go(func() {
			if err := loop(ctx, o); err != nil {
				t.Error(err)
			}
		})
	}
	// Until every kind of round has been seen by peer 0 (bounded by ctx).
	ready := func() bool {
		m := gathered(t, regs[0])
		return m["skyhive_averaging_staleness_rounds"] >= 1 && m["skyhive_averaging_rounds_total"] >= 4 &&
			m["skyhive_averaging_group_size"] >= 4
	}
	for !ready() && ctx.Err() == nil {
		time.Sleep(20 * time.Millisecond)
	}
	cancel()
	wg.Wait()
	// Group rounds still in flight in the background may finish between
	// reading the metrics and Stats (one CI run read 39,566 sent bytes
	// against Stats' 45,654): read both until they agree, for at most the
	// averager's Timeout and a margin.
	var m map[string]float64
	var want map[string]float64
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		s := opts[0].Stats()
		m = gathered(t, regs[0])
		want = map[string]float64{
			"skyhive_averaging_steps_total":          float64(s.Steps),
			"skyhive_averaging_samples_total":        float64(s.Samples),
			"skyhive_averaging_round":                float64(s.Round),
			"skyhive_averaging_rounds_total":         float64(s.GroupActive + s.GroupPassive + s.GlobalSyncs),
			"skyhive_averaging_sent_bytes_total":     float64(s.BytesSent),
			"skyhive_averaging_received_bytes_total": float64(s.BytesReceived),
		}
		agree := true
		for name, w := range want {
			agree = agree && m[name] == w
		}
		if agree || time.Now().After(deadline) {
			break
		}
	}
	for name, w := range want {
		if m[name] != w || w == 0 {
			t.Errorf("%s = %v, want Stats' %v (non-zero)", name, m[name], w)
		}
	}
	for _, name := range []string{"skyhive_averaging_group_size", "skyhive_averaging_staleness_rounds", "skyhive_averaging_collective_duration_seconds"} {
		if m[name] < 1 {
			t.Errorf("%s: %v observations, want some", name, m[name])
		}
	}
	if _, ok := m["skyhive_averaging_stragglers_dropped_total"]; !ok {
		t.Error("no skyhive_averaging_stragglers_dropped_total")
	}
	if problems, err := testutil.GatherAndLint(regs[0]); err != nil || len(problems) > 0 {
		t.Errorf("lint: %v %v", problems, err)
	}
	opts[0].Close()
	if n, _ := testutil.GatherAndCount(regs[0]); n != 0 {
		t.Errorf("%d metrics after Close, want 0", n)
	}
}

// A second optimizer on one registry is refused.
func TestOptimizerMetricsRegisterOnce(t *testing.T) {
	net := memnet.NewNetwork()
	defer net.Close()
	p, err := net.NewPeer()
	if err != nil {
		t.Fatal(err)
	}
	a := averaging.New(p, averaging.Config{})
	defer a.Close()
	reg := prometheus.NewRegistry()
	cfg := Config{Algo: Local, Roster: []averaging.Member{{Peer: p.AddrInfo(), Weight: 1}}, GroupSize: 2, Metrics: reg}
	o, err := New(a, noopOpt{[]*nn.Param{vecParam(10, 0, 1)}}, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer o.Close()
	if _, err := New(a, noopOpt{[]*nn.Param{vecParam(10, 0, 1)}}, cfg); !errors.As(err, new(prometheus.AlreadyRegisteredError)) {
		t.Fatalf("second optimizer: %v, want AlreadyRegisteredError", err)
	}
}
