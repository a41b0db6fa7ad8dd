package metrics

import (
	"fmt"
	"math"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Training reports a training loop's progress to Prometheus: steps,
// samples and their rate, the loss (and accuracy, where the loop measures
// it) of the last step and of the last evaluation. Its methods cost a few
// atomic operations, are safe for concurrent use, and do nothing on a nil
// *Training, which NewTraining returns without a registerer.
type Training struct {
	reg            prometheus.Registerer
	steps, samples atomic.Int64
	start          atomic.Int64 // unix nanoseconds of the first step
	// float64 bits; NaN until reported
	loss, acc, evalLoss, evalAcc atomic.Uint64
}

var (
	trainSteps = prometheus.NewDesc("skyhive_train_steps_total",
		"Optimizer steps taken by this process's training loop.", nil, nil)
	trainSamples = prometheus.NewDesc("skyhive_train_samples_total",
		"Training examples processed (images, or sequences of a language model); rate() of it is the current throughput.", nil, nil)
	trainRate = prometheus.NewDesc("skyhive_train_samples_per_second",
		"Mean training throughput since the first step, in examples per second.", nil, nil)
	trainLoss = prometheus.NewDesc("skyhive_train_loss",
		"Training loss of the last step (cross-entropy per example, or per token for a language model).", nil, nil)
	trainAcc = prometheus.NewDesc("skyhive_train_accuracy",
		"Training accuracy of the last step's batch (fraction of labels predicted), where the loop measures it.", nil, nil)
	evalLoss = prometheus.NewDesc("skyhive_train_eval_loss",
		"Loss of the last evaluation on held-out data.", nil, nil)
	evalAcc = prometheus.NewDesc("skyhive_train_eval_accuracy",
		"Accuracy of the last evaluation on held-out data (image classifiers).", nil, nil)
)

// NewTraining registers a training collector with reg; a nil reg returns
// a nil *Training (metrics off).
func NewTraining(reg prometheus.Registerer) (*Training, error) {
	if reg == nil {
		return nil, nil
	}
	t := &Training{reg: reg}
	nan := math.Float64bits(math.NaN())
	for _, v := range []*atomic.Uint64{&t.loss, &t.acc, &t.evalLoss, &t.evalAcc} {
		v.Store(nan)
	}
	if err := reg.Register(t); err != nil {
		return nil, fmt.Errorf("metrics: training: %w", err)
	}
	return t, nil
}

// Step records one optimizer step over samples examples whose mean
// training loss was loss (NaN: not known).
func (t *Training) Step(samples int, loss float64) {
	if t == nil {
		return
	}
	if t.start.Load() == 0 {
		t.start.CompareAndSwap(0, time.Now().UnixNano())
	}
	t.steps.Add(1)
	t.samples.Add(int64(samples))
	if !math.IsNaN(loss) {
		t.loss.Store(math.Float64bits(loss))
	}
}

// Accuracy records the training accuracy of the last step's batch.
func (t *Training) Accuracy(acc float64) {
	if t != nil {
		t.acc.Store(math.Float64bits(acc))
	}
}

// Eval records an evaluation on held-out data; NaN leaves a value
// unreported (a language model reports no accuracy).
func (t *Training) Eval(loss, acc float64) {
	if t == nil {
		return
	}
	if !math.IsNaN(loss) {
		t.evalLoss.Store(math.Float64bits(loss))
	}
	if !math.IsNaN(acc) {
		t.evalAcc.Store(math.Float64bits(acc))
	}
}

// Close unregisters the collector.
func (t *Training) Close() {
	if t != nil {
		t.reg.Unregister(t)
	}
}

// Describe implements prometheus.Collector.
func (t *Training) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{trainSteps, trainSamples, trainRate, trainLoss, trainAcc, evalLoss, evalAcc} {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (t *Training) Collect(ch chan<- prometheus.Metric) {
	samples := float64(t.samples.Load())
	ch <- prometheus.MustNewConstMetric(trainSteps, prometheus.CounterValue, float64(t.steps.Load()))
	ch <- prometheus.MustNewConstMetric(trainSamples, prometheus.CounterValue, samples)
	if s := t.start.Load(); s != 0 {
		if d := time.Since(time.Unix(0, s)).Seconds(); d > 0 {
			ch <- prometheus.MustNewConstMetric(trainRate, prometheus.GaugeValue, samples/d)
		}
	}
	for _, g := range []struct {
		d *prometheus.Desc
		v *atomic.Uint64
	}{{trainLoss, &t.loss}, {trainAcc, &t.acc}, {evalLoss, &t.evalLoss}, {evalAcc, &t.evalAcc}} {
		if v := math.Float64frombits(g.v.Load()); !math.IsNaN(v) {
			ch <- prometheus.MustNewConstMetric(g.d, prometheus.GaugeValue, v)
		}
	}
}
