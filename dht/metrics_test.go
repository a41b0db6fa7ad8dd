package dht

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"
)

// metricValue is the value of name{labels} in g: a counter's or gauge's
// value, a histogram's count; -1 if there is no such metric.
func metricValue(t *testing.T, g prometheus.Gatherer, name string, labels ...string) float64 {
	t.Helper()
	fams, err := g.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fams {
		if f.GetName() != name {
			continue
		}
		for _, m := range f.GetMetric() {
			if !labelsMatch(m, labels) {
				continue
			}
			switch {
			case m.Counter != nil:
				return m.GetCounter().GetValue()
			case m.Gauge != nil:
				return m.GetGauge().GetValue()
			case m.Histogram != nil:
				return float64(m.GetHistogram().GetSampleCount())
			}
		}
	}
	return -1
}

// labelsMatch reports whether m has the label pairs kv (name, value, ...).
func labelsMatch(m *dto.Metric, kv []string) bool {
	for i := 0; i+1 < len(kv); i += 2 {
		found := false
		for _, l := range m.GetLabel() {
			if l.GetName() == kv[i] && l.GetValue() == kv[i+1] {
				found = true
			}
		}
		if !found {
			return false
		}
	}
	return true
}

func TestNodeMetrics(t *testing.T) {
	s := newSwarm(t, 5, Config{})
	reg := prometheus.NewRegistry()
	s.cfg.Metrics = reg
	n := s.add() // a node with metrics, replica of every key (k = 20 > 6 nodes)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	exp := time.Now().Add(time.Hour)
	for i := range 3 {
		if _, err := s.nodes[0].Store(ctx, fmt.Sprintf("key%d", i), "", []byte("v"), exp); err != nil {
			t.Fatal(err)
		}
	}
	// An older record than the one stored: refused as stale.
	s.nodes[1].Store(ctx, "key0", "", []byte("old"), exp.Add(-time.Minute))
	if _, err := n.Store(ctx, "mine", "", []byte("v"), exp); err != nil {
		t.Fatal(err)
	}
	if _, err := n.Get(ctx, "key1"); err != nil {
		t.Fatal(err)
	}
	atLeast := func(want float64, name string, labels ...string) {
		t.Helper()
		if v := metricValue(t, reg, name, labels...); v < want {
			t.Errorf("%s%v = %v, want at least %v", name, labels, v, want)
		}
	}
	atLeast(4, "skyhive_dht_records") // key0..2 and mine
	atLeast(5, "skyhive_dht_routing_table_peers")
	atLeast(3, "skyhive_dht_stores_accepted_total")
	atLeast(3, "skyhive_dht_requests_total", "type", "store")
	atLeast(1, "skyhive_dht_stores_refused_total", "reason", "stale")
	atLeast(1, "skyhive_dht_lookups_total", "kind", "find_node")
	atLeast(1, "skyhive_dht_lookups_total", "kind", "find_value")
	atLeast(1, "skyhive_dht_lookup_queries_total", "kind", "find_value")
	atLeast(1, "skyhive_dht_lookup_hops", "kind", "find_value")
	atLeast(1, "skyhive_dht_lookup_hops", "kind", "find_node")
	atLeast(1, "skyhive_dht_lookup_duration_seconds", "kind", "find_value")
	atLeast(1, "skyhive_dht_cached_records") // key1, from the Get
	if v := metricValue(t, reg, "skyhive_dht_stores_refused_total", "reason", "quota"); v != 0 {
		t.Errorf("%v refused for quota, want 0", v)
	}
	if problems, err := testutil.GatherAndLint(reg); err != nil || len(problems) > 0 {
		t.Errorf("lint: %v %v", problems, err)
	}
	if err := n.Close(); err != nil {
		t.Fatal(err)
	}
	if c, _ := testutil.GatherAndCount(reg); c != 0 {
		t.Errorf("%d metrics after Close, want 0", c)
	}
}

func TestStoreRefusalReasons(t *testing.T) {
	reg := prometheus.NewRegistry()
	m, err := newNodeMetrics(&Node{}, reg)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		err    error
		reason string
	}{
		{ErrExpired, "invalid"}, {ErrBadSignature, "invalid"}, {fmt.Errorf("%w: x", ErrTTL), "invalid"},
		{errNotReplica, "not_replica"}, {ErrStale, "stale"}, {ErrOwned, "conflict"}, {ErrDictionary, "conflict"},
		{fmt.Errorf("%w: storage full", ErrQuota), "quota"},
	} {
		before := testutil.ToFloat64(m.refused[c.reason])
		m.stored(c.err)
		if after := testutil.ToFloat64(m.refused[c.reason]); after != before+1 {
			t.Errorf("%v: not counted as %s", c.err, c.reason)
		}
	}
	m.stored(nil)
	if v := testutil.ToFloat64(m.accepted); v != 1 {
		t.Errorf("accepted %v, want 1", v)
	}
}
