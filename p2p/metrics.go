package p2p

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/protocol"
	"github.com/prometheus/client_golang/prometheus"
)

// Metrics of a Host (Config.Metrics). Connections, peers and streams are
// counted when Prometheus scrapes; calls are counted per protocol as they
// end: bytes are RPC payloads (requests and responses, without framing),
// durations those of whole calls (side "client") and of handler runs
// (side "server").
var (
	p2pConnsDesc = prometheus.NewDesc("skyhive_p2p_connections",
		"Open libp2p connections, by direction and transport.", []string{"direction", "transport"}, nil)
	p2pPeersDesc = prometheus.NewDesc("skyhive_p2p_peers",
		"Peers with at least one open connection.", nil, nil)
	p2pStreamsDesc = prometheus.NewDesc("skyhive_p2p_streams",
		"Open libp2p streams, by protocol and direction.", []string{"protocol", "direction"}, nil)
)

// maxMetricProtocols bounds the protocol label's values; calls on further
// protocols are counted under "other".
const maxMetricProtocols = 64

// hostMetrics is a Host's Prometheus collector.
type hostMetrics struct {
	h     *Host
	reg   prometheus.Registerer
	sent  *prometheus.CounterVec
	recv  *prometheus.CounterVec
	errs  *prometheus.CounterVec
	dur   *prometheus.HistogramVec
	mu    sync.Mutex // serializes adding to protos
	n     atomic.Int32
	proto sync.Map // protocol.ID → *protoMetrics
}

// protoMetrics are one protocol's instruments, resolved once.
type protoMetrics struct {
	sent, recv            prometheus.Counter
	callErrs, serveErrs   prometheus.Counter
	callTimes, serveTimes prometheus.Observer
}

func newHostMetrics(h *Host, reg prometheus.Registerer) (*hostMetrics, error) {
	m := &hostMetrics{
		h:   h,
		reg: reg,
		sent: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "skyhive_p2p_sent_bytes_total",
			Help: "RPC payload bytes sent (requests of calls made, responses of calls served), by protocol."}, []string{"protocol"}),
		recv: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "skyhive_p2p_received_bytes_total",
			Help: "RPC payload bytes received (responses of calls made, requests of calls served), by protocol."}, []string{"protocol"}),
		errs: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "skyhive_p2p_rpc_errors_total",
			Help: "Failed RPCs by protocol and side: calls made that failed (client) and handlers that returned an error (server)."}, []string{"protocol", "side"}),
		dur: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "skyhive_p2p_rpc_duration_seconds",
			Help:    "Duration of RPCs by protocol and side: whole calls made (client), handler runs (server).",
			Buckets: []float64{0.0002, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60}}, []string{"protocol", "side"}),
	}
	if err := reg.Register(m); err != nil {
		return nil, fmt.Errorf("p2p: metrics: %w", err)
	}
	return m, nil
}

// of returns proto's instruments.
func (m *hostMetrics) of(proto protocol.ID) *protoMetrics {
	if p, ok := m.proto.Load(proto); ok {
		return p.(*protoMetrics)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if p, ok := m.proto.Load(proto); ok {
		return p.(*protoMetrics)
	}
	label := string(proto)
	if m.n.Load() >= maxMetricProtocols {
		label = "other"
	}
	p := &protoMetrics{
		sent: m.sent.WithLabelValues(label), recv: m.recv.WithLabelValues(label),
		callErrs: m.errs.WithLabelValues(label, "client"), serveErrs: m.errs.WithLabelValues(label, "server"),
		callTimes: m.dur.WithLabelValues(label, "client"), serveTimes: m.dur.WithLabelValues(label, "server"),
	}
	if label != "other" {
		m.n.Add(1)
		m.proto.Store(proto, p)
	}
	return p
}

// called counts a call made on proto that started at t0.
func (m *hostMetrics) called(proto protocol.ID, t0 time.Time, sent, recv int64, err error) {
	p := m.of(proto)
	p.callTimes.Observe(time.Since(t0).Seconds())
	if err != nil {
		p.callErrs.Inc()
		var re *RemoteError
		if !errors.As(err, &re) {
			return // the exchange broke: its bytes are not known
		}
	}
	p.sent.Add(float64(sent))
	p.recv.Add(float64(recv))
}

// served counts a call served on proto whose handler started at t0.
func (m *hostMetrics) served(proto protocol.ID, t0 time.Time, recv, sent int64, err error) {
	p := m.of(proto)
	p.serveTimes.Observe(time.Since(t0).Seconds())
	if err != nil {
		p.serveErrs.Inc()
	}
	p.sent.Add(float64(sent))
	p.recv.Add(float64(recv))
}

// Describe implements prometheus.Collector.
func (m *hostMetrics) Describe(ch chan<- *prometheus.Desc) {
	ch <- p2pConnsDesc
	ch <- p2pPeersDesc
	ch <- p2pStreamsDesc
	m.sent.Describe(ch)
	m.recv.Describe(ch)
	m.errs.Describe(ch)
	m.dur.Describe(ch)
}

// Collect implements prometheus.Collector.
func (m *hostMetrics) Collect(ch chan<- prometheus.Metric) {
	type connKey struct{ dir, transport string }
	type streamKey struct{ proto, dir string }
	conns := map[connKey]int{}
	streams := map[streamKey]int{}
	nw := m.h.h.Network()
	for _, c := range nw.Conns() {
		t := c.ConnState().Transport
		if t == "" {
			t = "unknown"
		}
		conns[connKey{direction(c.Stat().Direction), t}]++
		for _, s := range c.GetStreams() {
			p := string(s.Protocol())
			if p == "" {
				p = "unknown" // still negotiating
			}
			streams[streamKey{p, direction(s.Stat().Direction)}]++
		}
	}
	for _, d := range []string{"inbound", "outbound"} {
		// Both directions of the host's transports are always reported, so
		// that a series drops to 0 instead of disappearing.
		for _, t := range []string{"tcp", "quic-v1"} {
			if _, ok := conns[connKey{d, t}]; !ok {
				conns[connKey{d, t}] = 0
			}
		}
	}
	for k, n := range conns {
		ch <- prometheus.MustNewConstMetric(p2pConnsDesc, prometheus.GaugeValue, float64(n), k.dir, k.transport)
	}
	for k, n := range streams {
		ch <- prometheus.MustNewConstMetric(p2pStreamsDesc, prometheus.GaugeValue, float64(n), k.proto, k.dir)
	}
	ch <- prometheus.MustNewConstMetric(p2pPeersDesc, prometheus.GaugeValue, float64(len(nw.Peers())))
	m.sent.Collect(ch)
	m.recv.Collect(ch)
	m.errs.Collect(ch)
	m.dur.Collect(ch)
}

func direction(d network.Direction) string {
	switch d {
	case network.DirInbound:
		return "inbound"
	case network.DirOutbound:
		return "outbound"
	}
	return "unknown"
}

// byteTally receives a streamed call's payload bytes.
type byteTally struct{ sent, recv int64 }
