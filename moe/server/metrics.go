package server

import (
	"fmt"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Metrics of a Server (Config.Metrics). The experts' counters are summed
// over experts (a server may host thousands; the stats RPC has them one by
// one) and read, like the queue, when Prometheus scrapes; request
// latencies and batch sizes are observed as batches finish.
var (
	expertCalls = []string{"forward", "backward"}

	expExpertsDesc = prometheus.NewDesc("skyhive_expert_experts",
		"Experts this server hosts.", nil, nil)
	expRequestsDesc = prometheus.NewDesc("skyhive_expert_requests_total",
		"Expert requests answered, by call (forward, backward).", []string{"call"}, nil)
	expErrorsDesc = prometheus.NewDesc("skyhive_expert_request_errors_total",
		"Expert requests that failed or were refused (invalid, busy, failed batch), by call.", []string{"call"}, nil)
	expComputeDesc = prometheus.NewDesc("skyhive_expert_compute_seconds_total",
		"Time the experts spent computing batches, by call.", []string{"call"}, nil)
	expUpdatesDesc = prometheus.NewDesc("skyhive_expert_updates_total",
		"Optimizer steps of the experts.", nil, nil)
	expClippedDesc = prometheus.NewDesc("skyhive_expert_clipped_steps_total",
		"Expert optimizer steps whose gradient norm was clipped.", nil, nil)
	expSkippedDesc = prometheus.NewDesc("skyhive_expert_skipped_steps_total",
		"Expert optimizer steps skipped because their gradients were not finite.", nil, nil)
	expRollbacksDesc = prometheus.NewDesc("skyhive_expert_rollbacks_total",
		"Experts restored to their last good state at a checkpoint.", nil, nil)
	expQueueDesc = prometheus.NewDesc("skyhive_expert_queue_requests",
		"Requests queued for a batch, over all experts.", nil, nil)
	expQueueBytesDesc = prometheus.NewDesc("skyhive_expert_queue_bytes",
		"Bytes of the input tensors of the requests queued or running (bounded by --queue-memory).", nil, nil)
	expRunningDesc = prometheus.NewDesc("skyhive_expert_running_batches",
		"Batches being computed.", nil, nil)
	expDeclareFailDesc = prometheus.NewDesc("skyhive_expert_declare_failures_total",
		"Failed DHT stores of expert declarations.", nil, nil)
	expDeclaredDesc = prometheus.NewDesc("skyhive_expert_last_declared_timestamp_seconds",
		"When the last round of DHT declarations finished (Unix time).", nil, nil)
)

// serverMetrics is a Server's Prometheus collector.
type serverMetrics struct {
	s       *Server
	reg     prometheus.Registerer
	latency *prometheus.HistogramVec
	rows    *prometheus.HistogramVec
	// by call: 0 forward, 1 backward
	latencyOf, rowsOf [2]prometheus.Observer
}

func newServerMetrics(s *Server, reg prometheus.Registerer) (*serverMetrics, error) {
	m := &serverMetrics{
		s: s, reg: reg,
		latency: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "skyhive_expert_request_duration_seconds",
			Help:    "Time from a request's arrival to its answer (queueing and compute), by call.",
			Buckets: []float64{0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30}}, []string{"call"}),
		rows: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "skyhive_expert_batch_rows",
			Help:    "Rows (samples) per processed batch, by call; its _count is the batches.",
			Buckets: prometheus.ExponentialBuckets(1, 2, 13)}, []string{"call"}),
	}
	for i, c := range expertCalls {
		m.latencyOf[i] = m.latency.WithLabelValues(c)
		m.rowsOf[i] = m.rows.WithLabelValues(c)
	}
	if err := reg.Register(m); err != nil {
		return nil, fmt.Errorf("moe/server: metrics: %w", err)
	}
	return m, nil
}

func callIndex(backward bool) int {
	if backward {
		return 1
	}
	return 0
}

// batch observes a processed batch of rows and its requests' latencies
// (answered at end).
func (m *serverMetrics) batch(backward bool, rows int, batch []*task, end time.Time) {
	k := callIndex(backward)
	m.rowsOf[k].Observe(float64(rows))
	for _, t := range batch {
		m.latencyOf[k].Observe(end.Sub(t.enq).Seconds())
	}
}

// Describe implements prometheus.Collector.
func (m *serverMetrics) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{expExpertsDesc, expRequestsDesc, expErrorsDesc, expComputeDesc,
		expUpdatesDesc, expClippedDesc, expSkippedDesc, expRollbacksDesc, expQueueDesc, expQueueBytesDesc,
		expRunningDesc, expDeclareFailDesc, expDeclaredDesc} {
		ch <- d
	}
	m.latency.Describe(ch)
	m.rows.Describe(ch)
}

// Collect implements prometheus.Collector.
func (m *serverMetrics) Collect(ch chan<- prometheus.Metric) {
	s := m.s
	var sum ExpertStats
	for _, uid := range s.order {
		e := s.experts[uid]
		e.statsMu.Lock()
		st := e.stats
		e.statsMu.Unlock()
		for _, c := range []struct{ to, from *CallStats }{{&sum.Forward, &st.Forward}, {&sum.Backward, &st.Backward}} {
			c.to.Requests += c.from.Requests
			c.to.Errors += c.from.Errors
			c.to.RunSeconds += c.from.RunSeconds
		}
		sum.Updates += st.Updates
		sum.ClippedSteps += st.ClippedSteps
		sum.SkippedSteps += st.SkippedSteps
		sum.Rollbacks += st.Rollbacks
	}
	r := s.rt
	r.mu.Lock()
	queued, queuedBytes, running := 0, r.queuedBytes, len(r.busy)
	for _, p := range r.queued {
		queued += len(p.tasks)
	}
	r.mu.Unlock()
	s.declMu.Lock()
	declared, declareFails := s.declared, s.declareFails
	s.declMu.Unlock()

	gauge := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
	}
	counter := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, v, labels...)
	}
	gauge(expExpertsDesc, float64(len(s.order)))
	for i, c := range []CallStats{sum.Forward, sum.Backward} {
		counter(expRequestsDesc, float64(c.Requests), expertCalls[i])
		counter(expErrorsDesc, float64(c.Errors), expertCalls[i])
		counter(expComputeDesc, c.RunSeconds, expertCalls[i])
	}
	counter(expUpdatesDesc, float64(sum.Updates))
	counter(expClippedDesc, float64(sum.ClippedSteps))
	counter(expSkippedDesc, float64(sum.SkippedSteps))
	counter(expRollbacksDesc, float64(sum.Rollbacks))
	gauge(expQueueDesc, float64(queued))
	gauge(expQueueBytesDesc, float64(queuedBytes))
	gauge(expRunningDesc, float64(running))
	counter(expDeclareFailDesc, float64(declareFails))
	if !declared.IsZero() {
		gauge(expDeclaredDesc, float64(declared.UnixNano())/1e9)
	}
	m.latency.Collect(ch)
	m.rows.Collect(ch)
}
