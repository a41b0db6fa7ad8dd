package pipeline

import (
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/skyhive/skyhive/metrics"
)

// Metrics of a coordinator (CoordinatorConfig.Metrics): every committed
// iteration adds its stages' compute, communication and idle time; re-plans
// are counted as they are installed; the workers are counted when
// Prometheus scrapes. The training loss, accuracy and examples are the
// skyhive_train_* family (metrics.Training).
var pipeWorkersDesc = prometheus.NewDesc("skyhive_pipeline_workers",
	"Workers registered with the coordinator, by state (alive, dead).", []string{"state"}, nil)

// coordMetrics is a Coordinator's Prometheus collector.
type coordMetrics struct {
	c        *Coordinator
	reg      prometheus.Registerer
	train    *metrics.Training
	iters    prometheus.Counter
	duration prometheus.Histogram
	stages   prometheus.Gauge
	gen      prometheus.Gauge
	replans  *prometheus.CounterVec
	compute  *prometheus.CounterVec
	comm     *prometheus.CounterVec
	idle     *prometheus.CounterVec

	mu       sync.Mutex // the session's goroutine and Close
	perStage [][3]prometheus.Counter
}

func newCoordMetrics(c *Coordinator, reg prometheus.Registerer) (*coordMetrics, error) {
	stage := func(name, help string) *prometheus.CounterVec {
		return prometheus.NewCounterVec(prometheus.CounterOpts{Name: name, Help: help}, []string{"stage"})
	}
	m := &coordMetrics{
		c: c, reg: reg,
		iters: prometheus.NewCounter(prometheus.CounterOpts{Name: "skyhive_pipeline_iterations_total",
			Help: "Pipeline iterations committed."}),
		duration: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "skyhive_pipeline_iteration_duration_seconds",
			Help: "Wall time of committed pipeline iterations.", Buckets: []float64{0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120}}),
		stages: prometheus.NewGauge(prometheus.GaugeOpts{Name: "skyhive_pipeline_stages",
			Help: "Stages of the running plan."}),
		gen: prometheus.NewGauge(prometheus.GaugeOpts{Name: "skyhive_pipeline_plan_generation",
			Help: "Generation of the running plan (it grows with every plan installed)."}),
		replans: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "skyhive_pipeline_replans_total",
			Help: "Plans installed after the first, by reason: failure (a worker failed or died) or drift (a stage's speed drifted from the plan)."}, []string{"reason"}),
		compute: stage("skyhive_pipeline_stage_compute_seconds_total",
			"Compute time of each stage in committed iterations: forward, backward and optimizer step, emulated slowdown included."),
		comm: stage("skyhive_pipeline_stage_communication_seconds_total",
			"Time each stage spent sending activations or gradients (overlapping its compute)."),
		idle: stage("skyhive_pipeline_stage_idle_seconds_total",
			"Time each stage waited for a neighbour's activations or gradients."),
	}
	m.replans.WithLabelValues("failure")
	m.replans.WithLabelValues("drift")
	if err := reg.Register(m); err != nil {
		return nil, fmt.Errorf("pipeline: metrics: %w", err)
	}
	t, err := metrics.NewTraining(reg)
	if err != nil {
		reg.Unregister(m)
		return nil, fmt.Errorf("pipeline: %w", err)
	}
	m.train = t
	return m, nil
}

func (m *coordMetrics) close() {
	m.train.Close()
	m.reg.Unregister(m)
}

// iteration records a committed iteration of n examples.
func (m *coordMetrics) iteration(st IterStats, n int) {
	m.iters.Inc()
	m.duration.Observe(st.Seconds)
	m.train.Step(n, st.Loss)
	m.train.Accuracy(st.Accuracy)
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, t := range st.Stages {
		if t.Stage < 0 || t.Stage >= maxStages {
			continue
		}
		for len(m.perStage) <= t.Stage {
			k := strconv.Itoa(len(m.perStage))
			m.perStage = append(m.perStage, [3]prometheus.Counter{
				m.compute.WithLabelValues(k), m.comm.WithLabelValues(k), m.idle.WithLabelValues(k)})
		}
		c := m.perStage[t.Stage]
		c[0].Add(t.Compute)
		c[1].Add(t.Comm)
		c[2].Add(t.Idle)
	}
}

// plan records an installed plan of stages stages.
func (m *coordMetrics) plan(gen uint64, stages int) {
	m.gen.Set(float64(gen))
	m.stages.Set(float64(stages))
}

// Describe implements prometheus.Collector.
func (m *coordMetrics) Describe(ch chan<- *prometheus.Desc) {
	ch <- pipeWorkersDesc
	for _, c := range m.collectors() {
		c.Describe(ch)
	}
}

// Collect implements prometheus.Collector.
func (m *coordMetrics) Collect(ch chan<- prometheus.Metric) {
	alive, dead := 0, 0
	m.c.mu.Lock()
	for _, w := range m.c.workers {
		if w.Alive {
			alive++
		} else {
			dead++
		}
	}
	m.c.mu.Unlock()
	ch <- prometheus.MustNewConstMetric(pipeWorkersDesc, prometheus.GaugeValue, float64(alive), "alive")
	ch <- prometheus.MustNewConstMetric(pipeWorkersDesc, prometheus.GaugeValue, float64(dead), "dead")
	for _, c := range m.collectors() {
		c.Collect(ch)
	}
}

func (m *coordMetrics) collectors() []prometheus.Collector {
	return []prometheus.Collector{m.iters, m.duration, m.stages, m.gen, m.replans, m.compute, m.comm, m.idle}
}

// workerMetrics is a Worker's Prometheus collector: the time of the
// iterations it ran, whatever stage it held.
type workerMetrics struct {
	reg                 prometheus.Registerer
	stage               atomic.Int64 // the stage of the last iteration, -1 before any
	iters, failed       prometheus.Counter
	compute, comm, idle prometheus.Counter
}

var pipeWorkerStageDesc = prometheus.NewDesc("skyhive_pipeline_worker_stage",
	"Stage this worker ran its last iteration as (-1: none yet).", nil, nil)

func newWorkerMetrics(reg prometheus.Registerer) (*workerMetrics, error) {
	counter := func(name, help string) prometheus.Counter {
		return prometheus.NewCounter(prometheus.CounterOpts{Name: name, Help: help})
	}
	m := &workerMetrics{
		reg:   reg,
		iters: counter("skyhive_pipeline_worker_iterations_total", "Iterations this worker ran to the end of its schedule."),
		failed: counter("skyhive_pipeline_worker_iteration_errors_total",
			"Iterations this worker could not finish (a neighbour failed, an abort, a timeout)."),
		compute: counter("skyhive_pipeline_worker_compute_seconds_total",
			"Compute time of this worker's iterations: forward and backward passes, emulated slowdown included."),
		comm: counter("skyhive_pipeline_worker_communication_seconds_total",
			"Time this worker spent sending activations or gradients."),
		idle: counter("skyhive_pipeline_worker_idle_seconds_total",
			"Time this worker waited for its neighbours' activations or gradients."),
	}
	m.stage.Store(-1)
	if err := reg.Register(m); err != nil {
		return nil, fmt.Errorf("pipeline: metrics: %w", err)
	}
	return m, nil
}

// iteration records an iteration run as stage.
func (m *workerMetrics) iteration(stage int, resp iterResp, err error) {
	m.stage.Store(int64(stage))
	if err != nil {
		m.failed.Inc()
		return
	}
	m.iters.Inc()
	m.compute.Add(resp.Compute)
	m.comm.Add(resp.Comm)
	m.idle.Add(resp.Idle)
}

// Describe implements prometheus.Collector.
func (m *workerMetrics) Describe(ch chan<- *prometheus.Desc) {
	ch <- pipeWorkerStageDesc
	for _, c := range []prometheus.Collector{m.iters, m.failed, m.compute, m.comm, m.idle} {
		c.Describe(ch)
	}
}

// Collect implements prometheus.Collector.
func (m *workerMetrics) Collect(ch chan<- prometheus.Metric) {
	ch <- prometheus.MustNewConstMetric(pipeWorkerStageDesc, prometheus.GaugeValue, float64(m.stage.Load()))
	for _, c := range []prometheus.Collector{m.iters, m.failed, m.compute, m.comm, m.idle} {
		c.Collect(ch)
	}
}

// replanned counts a re-plan installed: forced by a failure, or for drift.
func (m *coordMetrics) replanned(failure bool) {
	reason := "drift"
	if failure {
		reason = "failure"
	}
	m.replans.WithLabelValues(reason).Inc()
}
