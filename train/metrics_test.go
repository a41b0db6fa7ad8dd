package train

import (
	"context"
	"io"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// keepRegistry registers into a registry and ignores Unregister, so that
// a test can gather what a finished run reported.
type keepRegistry struct {
	*prometheus.Registry
	unregistered int
}

func (k *keepRegistry) Unregister(prometheus.Collector) bool { k.unregistered++; return true }

func TestRunReportsMetrics(t *testing.T) {
	trainSet, testSet := blobs(t, 320, 100)
	cfg := testConfig(t.TempDir())
	cfg.Checkpoint = ""
	reg := &keepRegistry{Registry: prometheus.NewRegistry()}
	cfg.Metrics = reg
	if _, err := Run(context.Background(), cfg, trainSet, testSet, io.Discard); err != nil {
		t.Fatal(err)
	}
	if reg.unregistered != 1 {
		t.Errorf("%d collectors unregistered at the end, want 1", reg.unregistered)
	}
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, f := range fams {
		m := f.GetMetric()[0]
		got[f.GetName()] = m.GetCounter().GetValue() + m.GetGauge().GetValue()
	}
	steps := float64(2 * (trainSet.Len() / cfg.BatchSize)) // two epochs, last partial batch dropped
	if got["skyhive_train_steps_total"] != steps || got["skyhive_train_samples_total"] != steps*float64(cfg.BatchSize) {
		t.Errorf("steps %v, samples %v; want %v steps of %d", got["skyhive_train_steps_total"], got["skyhive_train_samples_total"], steps, cfg.BatchSize)
	}
	for _, name := range []string{"skyhive_train_loss", "skyhive_train_eval_loss", "skyhive_train_eval_accuracy", "skyhive_train_samples_per_second"} {
		if !(got[name] > 0) {
			t.Errorf("%s = %v, want > 0", name, got[name])
		}
	}
	if problems, err := testutil.GatherAndLint(reg); err != nil || len(problems) > 0 {
		t.Errorf("lint: %v %v", problems, err)
	}
}
