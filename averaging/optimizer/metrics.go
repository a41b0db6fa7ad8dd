package optimizer

import (
	"context"
	"fmt"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/skyhive/skyhive/averaging"
)

// Metrics of an Optimizer (Config.Metrics): its Stats are read when
// Prometheus scrapes; group sizes, stragglers, collective durations and
// staleness are observed as collectives end.
var (
	avgStepsDesc = prometheus.NewDesc("skyhive_averaging_steps_total",
		"Local optimizer steps taken through the averaging optimizer.", nil, nil)
	avgSamplesDesc = prometheus.NewDesc("skyhive_averaging_samples_total",
		"Training examples of those steps.", nil, nil)
	avgRoundDesc = prometheus.NewDesc("skyhive_averaging_round",
		"Round counter of this peer's model.", nil, nil)
	avgRoundsDesc = prometheus.NewDesc("skyhive_averaging_rounds_total",
		"Averaging rounds this peer took part in, by kind: group (WAGMA group rounds joined, DHT-matched groups with partners) and global (synchronous averages with every peer).",
		[]string{"kind"}, nil)
	avgDeclinedDesc = prometheus.NewDesc("skyhive_averaging_rounds_declined_total",
		"Group rounds declined because too many averages were in flight.", nil, nil)
	avgAloneDesc = prometheus.NewDesc("skyhive_averaging_rounds_alone_total",
		"DHT-matched rounds that found no partner.", nil, nil)
	avgFailuresDesc = prometheus.NewDesc("skyhive_averaging_failures_total",
		"Collectives with failed or missing members.", nil, nil)
	avgMatchErrDesc = prometheus.NewDesc("skyhive_averaging_match_errors_total",
		"DHT-matched rounds lost to DHT errors.", nil, nil)
	avgSentDesc = prometheus.NewDesc("skyhive_averaging_sent_bytes_total",
		"Payload bytes this peer sent in collectives.", nil, nil)
	avgRecvDesc = prometheus.NewDesc("skyhive_averaging_received_bytes_total",
		"Payload bytes this peer received in collectives.", nil, nil)
	avgWaitDesc = prometheus.NewDesc("skyhive_averaging_wait_seconds_total",
		"Time Step blocked in synchronous averaging.", nil, nil)
	avgDeadDesc = prometheus.NewDesc("skyhive_averaging_dead_peers",
		"Roster peers given up on.", nil, nil)
	avgRejectedDesc = prometheus.NewDesc("skyhive_averaging_rejected_total",
		"Contributions of members dropped by the norm check or robust aggregation.", nil, nil)
	avgRefusedDesc = prometheus.NewDesc("skyhive_averaging_activations_refused_total",
		"Activations refused: from a peer outside the roster, or naming a round outside the window.", nil, nil)
	avgStatesDesc = prometheus.NewDesc("skyhive_averaging_states_served_total",
		"Model and optimizer states served to joining peers.", nil, nil)
	avgOuterDesc = prometheus.NewDesc("skyhive_averaging_outer_steps_total",
		"DiLoCo outer steps applied.", nil, nil)
)

// optimizerMetrics is an Optimizer's Prometheus collector.
type optimizerMetrics struct {
	o          *Optimizer
	reg        prometheus.Registerer
	groupSize  prometheus.Histogram
	duration   prometheus.Histogram
	staleness  prometheus.Histogram
	stragglers prometheus.Counter
}

func newOptimizerMetrics(o *Optimizer, reg prometheus.Registerer) (*optimizerMetrics, error) {
	m := &optimizerMetrics{
		o: o, reg: reg,
		groupSize: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "skyhive_averaging_group_size",
			Help:    "Members (this peer included) of the collectives this peer took part in.",
			Buckets: []float64{2, 3, 4, 6, 8, 12, 16, 24, 32, 64, 128, 256}}),
		duration: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "skyhive_averaging_collective_duration_seconds",
			Help:    "Wall time of this peer's all-reduces.",
			Buckets: []float64{0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120}}),
		staleness: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "skyhive_averaging_staleness_rounds",
			Help:    "Local steps this peer took between the snapshot a background group average started from and the arrival of its result.",
			Buckets: []float64{0, 1, 2, 3, 4, 6, 8, 12, 16, 32, 64}}),
		stragglers: prometheus.NewCounter(prometheus.CounterOpts{Name: "skyhive_averaging_stragglers_dropped_total",
			Help: "Members the collectives went on without (failed, or missing when the reduce wait ended)."}),
	}
	if err := reg.Register(m); err != nil {
		return nil, fmt.Errorf("averaging: metrics: %w", err)
	}
	return m, nil
}

// collective observes an all-reduce of size members.
func (m *optimizerMetrics) collective(ctx context.Context, size int, res averaging.Result) {
	m.groupSize.Observe(float64(size))
	if res.Elapsed > 0 {
		m.duration.Observe(res.Elapsed.Seconds())
	}
	if ctx.Err() == nil {
		m.stragglers.Add(float64(len(res.Failed) + len(res.Missing)))
	}
}

// Describe implements prometheus.Collector.
func (m *optimizerMetrics) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{avgStepsDesc, avgSamplesDesc, avgRoundDesc, avgRoundsDesc, avgDeclinedDesc,
		avgAloneDesc, avgFailuresDesc, avgMatchErrDesc, avgSentDesc, avgRecvDesc, avgWaitDesc, avgDeadDesc,
		avgRejectedDesc, avgRefusedDesc, avgStatesDesc, avgOuterDesc} {
		ch <- d
	}
	m.groupSize.Describe(ch)
	m.duration.Describe(ch)
	m.staleness.Describe(ch)
	m.stragglers.Describe(ch)
}

// Collect implements prometheus.Collector.
func (m *optimizerMetrics) Collect(ch chan<- prometheus.Metric) {
	s := m.o.Stats()
	counter := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, v, labels...)
	}
	counter(avgStepsDesc, float64(s.Steps))
	counter(avgSamplesDesc, float64(s.Samples))
	ch <- prometheus.MustNewConstMetric(avgRoundDesc, prometheus.GaugeValue, float64(s.Round))
	counter(avgRoundsDesc, float64(s.GroupActive+s.GroupPassive+s.Groups), "group")
	counter(avgRoundsDesc, float64(s.GlobalSyncs), "global")
	counter(avgDeclinedDesc, float64(s.GroupDeclined))
	counter(avgAloneDesc, float64(s.Alone))
	counter(avgFailuresDesc, float64(s.Failures))
	counter(avgMatchErrDesc, float64(s.MatchErrors))
	counter(avgSentDesc, float64(s.BytesSent))
	counter(avgRecvDesc, float64(s.BytesReceived))
	counter(avgWaitDesc, s.WaitSeconds)
	ch <- prometheus.MustNewConstMetric(avgDeadDesc, prometheus.GaugeValue, float64(s.Dead))
	counter(avgRejectedDesc, float64(s.Rejected))
	counter(avgRefusedDesc, float64(s.Refused))
	counter(avgStatesDesc, float64(s.StatesServed))
	counter(avgOuterDesc, float64(s.OuterSteps))
	m.groupSize.Collect(ch)
	m.duration.Collect(ch)
	m.staleness.Collect(ch)
	m.stragglers.Collect(ch)
}
