package p2p

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/core/protocol"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"
)

// sample returns the value of the metric of family name whose labels
// include labels (a counter's or gauge's value, a histogram's count), and
// whether there is one.
func sample(t *testing.T, g prometheus.Gatherer, name string, labels map[string]string) (float64, bool) {
	t.Helper()
	fams, err := g.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fams {
		if f.GetName() != name {
			continue
		}
	next:
		for _, m := range f.GetMetric() {
			for k, v := range labels {
				if !hasLabel(m, k, v) {
					continue next
				}
			}
			switch {
			case m.Counter != nil:
				return m.GetCounter().GetValue(), true
			case m.Gauge != nil:
				return m.GetGauge().GetValue(), true
			case m.Histogram != nil:
				return float64(m.GetHistogram().GetSampleCount()), true
			}
		}
	}
	return 0, false
}

func hasLabel(m *dto.Metric, k, v string) bool {
	for _, l := range m.GetLabel() {
		if l.GetName() == k && l.GetValue() == v {
			return true
		}
	}
	return false
}

func TestHostMetrics(t *testing.T) {
	ra, rb := prometheus.NewRegistry(), prometheus.NewRegistry()
	a := newHost(t, "tcp", Config{Metrics: ra})
	b := newHost(t, "tcp", Config{Metrics: rb})
	b.SetHandler(echoProto, echo)
	b.SetHandler(failProto, func(context.Context, peer.ID, []byte) ([]byte, error) { return nil, errors.New("no") })
	b.SetStreamHandler(bigProto, func(_ context.Context, _ peer.ID, r io.Reader, w io.Writer) error {
		_, err := io.Copy(w, r)
		return err
	})
	ctx := ctxT(t, 30*time.Second)
	req := bytes.Repeat([]byte("x"), 1000)
	for range 3 {
		if _, err := a.Call(ctx, b.AddrInfo(), echoProto, req); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := a.Call(ctx, b.AddrInfo(), failProto, req[:10]); err == nil {
		t.Fatal("the failing handler succeeded")
	}
	var got bytes.Buffer
	var open float64 // the streams of bigProto open while the call runs
	err := a.CallStream(ctx, b.AddrInfo(), bigProto,
		func(w io.Writer) error { _, err := w.Write(make([]byte, 300_000)); return err },
		func(r io.Reader) error {
			open, _ = sample(t, ra, "skyhive_p2p_streams", map[string]string{"protocol": string(bigProto), "direction": "outbound"})
			_, err := io.Copy(&got, r)
			return err
		})
	if err != nil || got.Len() != 300_000 {
		t.Fatalf("stream: %d bytes back, %v", got.Len(), err)
	}

	echoL := map[string]string{"protocol": string(echoProto)}
	client := map[string]string{"protocol": string(echoProto), "side": "client"}
	server := map[string]string{"protocol": string(echoProto), "side": "server"}
	stream := map[string]string{"protocol": string(bigProto)}
	for _, c := range []struct {
		g      prometheus.Gatherer
		name   string
		labels map[string]string
		want   float64
	}{
		{ra, "skyhive_p2p_sent_bytes_total", echoL, 3000},
		{ra, "skyhive_p2p_received_bytes_total", echoL, 3000},
		{ra, "skyhive_p2p_rpc_duration_seconds", client, 3},
		{rb, "skyhive_p2p_rpc_duration_seconds", server, 3},
		{rb, "skyhive_p2p_sent_bytes_total", echoL, 3000},
		{ra, "skyhive_p2p_rpc_errors_total", map[string]string{"protocol": string(failProto), "side": "client"}, 1},
		{rb, "skyhive_p2p_rpc_errors_total", map[string]string{"protocol": string(failProto), "side": "server"}, 1},
		{ra, "skyhive_p2p_rpc_errors_total", client, 0},
		// A remote error's request still went out.
		{ra, "skyhive_p2p_sent_bytes_total", map[string]string{"protocol": string(failProto)}, 10},
		{ra, "skyhive_p2p_sent_bytes_total", stream, 300_000},
		{ra, "skyhive_p2p_received_bytes_total", stream, 300_000},
		{rb, "skyhive_p2p_received_bytes_total", stream, 300_000},
		{ra, "skyhive_p2p_connections", map[string]string{"direction": "outbound", "transport": "tcp"}, 1},
		{rb, "skyhive_p2p_connections", map[string]string{"direction": "inbound", "transport": "tcp"}, 1},
		{ra, "skyhive_p2p_connections", map[string]string{"direction": "inbound", "transport": "quic-v1"}, 0},
		{ra, "skyhive_p2p_peers", nil, 1},
	} {
		v, ok := sample(t, c.g, c.name, c.labels)
		if !ok || v != c.want {
			t.Errorf("%s%v = %v (found %v), want %v", c.name, c.labels, v, ok, c.want)
		}
	}
	if open != 1 {
		t.Errorf("%v outbound streams of %s during the call, want 1", open, bigProto)
	}
	for _, g := range []prometheus.Gatherer{ra, rb} {
		if problems, err := testutil.GatherAndLint(g); err != nil || len(problems) > 0 {
			t.Errorf("lint: %v %v", problems, err)
		}
	}
	// Close unregisters the collector, so the registry can take another.
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	if n, _ := testutil.GatherAndCount(ra); n != 0 {
		t.Errorf("%d metrics after Close, want 0", n)
	}
}

func TestHostMetricsRefusesASecondHostOnOneRegistry(t *testing.T) {
	reg := prometheus.NewRegistry()
	newHost(t, "tcp", Config{Metrics: reg})
	_, err := New(context.Background(), Config{ListenAddrs: []string{listenAddr("tcp")}, Metrics: reg})
	if !errors.As(err, new(prometheus.AlreadyRegisteredError)) {
		t.Fatalf("second host on one registry: %v, want AlreadyRegisteredError", err)
	}
}

// The protocol label takes at most maxMetricProtocols values.
func TestHostMetricsBoundProtocols(t *testing.T) {
	m := &hostMetrics{
		sent: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "s_total", Help: "s"}, []string{"protocol"}),
		recv: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "r_total", Help: "r"}, []string{"protocol"}),
		errs: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "e_total", Help: "e"}, []string{"protocol", "side"}),
		dur:  prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "d_seconds", Help: "d"}, []string{"protocol", "side"}),
	}
	for i := range 2 * maxMetricProtocols {
		m.of(protocol.ID(fmt.Sprintf("/skyhive/test/%d/1.0.0", i)))
	}
	if n := testutil.CollectAndCount(m.sent); n != maxMetricProtocols+1 {
		t.Errorf("%d protocol labels, want %d and other", n, maxMetricProtocols)
	}
}
