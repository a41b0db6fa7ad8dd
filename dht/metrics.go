package dht

import (
	"errors"
	"fmt"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Metrics of a Node (Config.Metrics): its storage and routing table are
// read when Prometheus scrapes; lookups, requests served and stores
// refused are counted as they happen.
var (
	dhtRecordsDesc = prometheus.NewDesc("skyhive_dht_records",
		"Records (items, each subkey counted) this node stores for the network.", nil, nil)
	dhtCachedDesc = prometheus.NewDesc("skyhive_dht_cached_records",
		"Records in this node's cache of what its own lookups found.", nil, nil)
	dhtPeersDesc = prometheus.NewDesc("skyhive_dht_routing_table_peers",
		"Peers in this node's routing table.", nil, nil)
)

// Lookup kinds (label "kind") and store refusals (label "reason").
var (
	lookupKinds   = []string{"find_node", "find_value"}
	refuseReasons = []string{"invalid", "not_replica", "stale", "conflict", "quota"}
	requestTypes  = []msgType{msgPing, msgStore, msgFindNode, msgFindValue}
)

// nodeMetrics is a Node's Prometheus collector. Its instruments are
// resolved once, so counting costs an atomic add.
type nodeMetrics struct {
	n    *Node
	reg  prometheus.Registerer
	vecs []prometheus.Collector

	lookups, lookupErrs, queries [2]prometheus.Counter // by kind: find_node, find_value
	duration, hops               [2]prometheus.Observer
	requests                     map[msgType]prometheus.Counter
	accepted                     prometheus.Counter
	refused                      map[string]prometheus.Counter
	answersCut, crowdedReads     prometheus.Counter
}

func newNodeMetrics(n *Node, reg prometheus.Registerer) (*nodeMetrics, error) {
	lookups := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "skyhive_dht_lookups_total",
		Help: "Iterative lookups this node ran, by kind (find_node: stores and refreshes; find_value: gets)."}, []string{"kind"})
	lookupErrs := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "skyhive_dht_lookup_errors_total",
		Help: "Lookups that failed (no peers, cancelled), by kind."}, []string{"kind"})
	queries := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "skyhive_dht_lookup_queries_total",
		Help: "RPCs sent by lookups, by kind."}, []string{"kind"})
	duration := prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "skyhive_dht_lookup_duration_seconds",
		Help: "Duration of lookups, by kind.", Buckets: []float64{0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30}}, []string{"kind"})
	hops := prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "skyhive_dht_lookup_hops",
		Help:    "Referral hops of lookups that reached a peer: to the first replica with a value (find_value) or to the closest peer (find_node); 1 is a peer of the routing table.",
		Buckets: prometheus.LinearBuckets(1, 1, 8)}, []string{"kind"})
	requests := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "skyhive_dht_requests_total",
		Help: "DHT requests this node answered, by type."}, []string{"type"})
	accepted := prometheus.NewCounter(prometheus.CounterOpts{Name: "skyhive_dht_stores_accepted_total",
		Help: "Records other peers stored on this node."})
	refused := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "skyhive_dht_stores_refused_total",
		Help: "Records other peers sent that this node refused, by reason: invalid (expired, too far ahead, bad signature), not_replica (not among the key's nearest, or pushed for caching), stale (a fresher one is stored), conflict (another writer's subkey, a plain value over a dictionary), quota (the peer's or address's share of the storage or of the key, or the storage, is full)."}, []string{"reason"})
	cut := prometheus.NewCounter(prometheus.CounterOpts{Name: "skyhive_dht_answers_cut_total",
		Help: "FIND_VALUE answers that left items out because their key holds more than one answer carries (shared fairly among the key's writers): a writer may be crowding the key."})
	crowded := prometheus.NewCounter(prometheus.CounterOpts{Name: "skyhive_dht_crowded_reads_total",
		Help: "Gets of this node that met a replica's answer near what one answer carries (half its items or bytes): a key crowded by many items, perhaps one writer's flood."})
	m := &nodeMetrics{
		n: n, reg: reg, accepted: accepted, answersCut: cut, crowdedReads: crowded,
		vecs:     []prometheus.Collector{lookups, lookupErrs, queries, duration, hops, requests, accepted, refused, cut, crowded},
		requests: map[msgType]prometheus.Counter{}, refused: map[string]prometheus.Counter{},
	}
	// Every series exists from the start, at 0.
	for i, k := range lookupKinds {
		m.lookups[i] = lookups.WithLabelValues(k)
		m.lookupErrs[i] = lookupErrs.WithLabelValues(k)
		m.queries[i] = queries.WithLabelValues(k)
		m.duration[i] = duration.WithLabelValues(k)
		m.hops[i] = hops.WithLabelValues(k)
	}
	for _, t := range requestTypes {
		m.requests[t] = requests.WithLabelValues(requestLabel(t))
	}
	for _, r := range refuseReasons {
		m.refused[r] = refused.WithLabelValues(r)
	}
	if err := reg.Register(m); err != nil {
		return nil, fmt.Errorf("dht: metrics: %w", err)
	}
	return m, nil
}

func lookupIndex(want msgType) int {
	if want == msgFindValue {
		return 1
	}
	return 0
}

func requestLabel(t msgType) string {
	switch t {
	case msgPing:
		return "ping"
	case msgStore:
		return "store"
	case msgFindNode:
		return "find_node"
	case msgFindValue:
		return "find_value"
	}
	return "other"
}

// lookup counts a lookup that started at t0 and sent queries RPCs.
func (m *nodeMetrics) lookup(want msgType, t0 time.Time, queries int, err error) {
	k := lookupIndex(want)
	m.lookups[k].Inc()
	m.queries[k].Add(float64(queries))
	m.duration[k].Observe(time.Since(t0).Seconds())
	if err != nil {
		m.lookupErrs[k].Inc()
	}
}

// hop observes a lookup's hops (from Stats; 0, no peer answered, is not).
func (m *nodeMetrics) hop(want msgType, hops int) {
	if hops >= 1 {
		m.hops[lookupIndex(want)].Observe(float64(hops))
	}
}

// request counts a request answered.
func (m *nodeMetrics) request(t msgType) {
	if c := m.requests[t]; c != nil {
		c.Inc()
	}
}

// stored counts one record a peer sent: accepted, or refused for err.
func (m *nodeMetrics) stored(err error) {
	if err == nil {
		m.accepted.Inc()
		return
	}
	reason := "invalid"
	switch {
	case errors.Is(err, errNotReplica):
		reason = "not_replica"
	case errors.Is(err, ErrStale):
		reason = "stale"
	case errors.Is(err, ErrOwned), errors.Is(err, ErrDictionary):
		reason = "conflict"
	case errors.Is(err, ErrQuota):
		reason = "quota"
	}
	m.refused[reason].Inc()
}

// errNotReplica refuses a record of a key this node is not a replica of,
// or one pushed for caching.
var errNotReplica = errors.New("dht: not a replica of the key")

// Describe implements prometheus.Collector.
func (m *nodeMetrics) Describe(ch chan<- *prometheus.Desc) {
	ch <- dhtRecordsDesc
	ch <- dhtCachedDesc
	ch <- dhtPeersDesc
	for _, v := range m.vecs {
		v.Describe(ch)
	}
}

// Collect implements prometheus.Collector.
func (m *nodeMetrics) Collect(ch chan<- prometheus.Metric) {
	n := m.n
	n.mu.Lock()
	records, cached := n.store.Len(), 0
	if n.cache != nil {
		cached = n.cache.Len()
	}
	n.mu.Unlock()
	ch <- prometheus.MustNewConstMetric(dhtRecordsDesc, prometheus.GaugeValue, float64(records))
	ch <- prometheus.MustNewConstMetric(dhtCachedDesc, prometheus.GaugeValue, float64(cached))
	ch <- prometheus.MustNewConstMetric(dhtPeersDesc, prometheus.GaugeValue, float64(n.rt.Size()))
	for _, v := range m.vecs {
		v.Collect(ch)
	}
}
