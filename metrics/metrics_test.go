package metrics

import (
	"context"
	"errors"
	"io"
	"math"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"go.uber.org/goleak"
)

// scrape fetches url and parses it in the Prometheus text format.
func scrape(t *testing.T, url string) map[string]*dto.MetricFamily {
	t.Helper()
	c := &http.Client{Timeout: 10 * time.Second}
	resp, err := c.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %s", url, resp.Status)
	}
	if ct := resp.Header.Get("Content-Type"); !strings.HasPrefix(ct, "text/plain") {
		t.Errorf("Content-Type %q, want the text format", ct)
	}
	p := expfmt.NewTextParser(model.LegacyValidation)
	fams, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatalf("parse %s: %v", url, err)
	}
	return fams
}

func TestServeScrapesAndStopsWithCtx(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	reg := NewRegistry()
	c := prometheus.NewCounter(prometheus.CounterOpts{Name: "skyhive_test_events_total", Help: "Events."})
	reg.Registerer().MustRegister(c)
	c.Add(3)
	ctx, cancel := context.WithCancel(context.Background())
	srv, err := Serve(ctx, "127.0.0.1:0", reg)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(srv.URL(), "http://127.0.0.1:") || strings.HasSuffix(srv.URL(), ":0/metrics") {
		t.Fatalf("URL %q does not name the bound port", srv.URL())
	}
	fams := scrape(t, srv.URL())
	for _, name := range []string{"skyhive_test_events_total", "go_goroutines", "go_build_info", "process_cpu_seconds_total"} {
		if fams[name] == nil {
			t.Errorf("no %s in the scrape", name)
		}
	}
	if v := fams["skyhive_test_events_total"].GetMetric()[0].GetCounter().GetValue(); v != 3 {
		t.Errorf("counter %v, want 3", v)
	}
	resp, err := http.Get("http://" + srv.Addr().String() + "/nothing")
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusNotFound {
		t.Errorf("/nothing: %s, want 404", resp.Status)
	}

	cancel()
	select {
	case <-srv.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("server still running 5s after its ctx ended")
	}
	if err := srv.Close(); err != nil {
		t.Errorf("Close after ctx: %v", err)
	}
	if _, err := http.Get(srv.URL()); err == nil {
		t.Error("the server still answers after it stopped")
	}
}

func TestServeReportsABusyAddress(t *testing.T) {
	reg := NewRegistry()
	a, err := Serve(context.Background(), "127.0.0.1:0", reg)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	_, err = Serve(context.Background(), a.Addr().String(), reg)
	if err == nil || !strings.Contains(err.Error(), "address already in use") {
		t.Fatalf("second Serve on %s: %v, want address already in use", a.Addr(), err)
	}
	if _, err := Serve(context.Background(), "127.0.0.1:0", nil); err == nil {
		t.Error("Serve of a nil registry did not fail")
	}
}

func TestNilRegistryMeansNoMetrics(t *testing.T) {
	var r *Registry
	if r.Registerer() != nil || r.Gatherer() != nil {
		t.Fatal("a nil registry has a registerer or gatherer")
	}
	tr, err := NewTraining(nil)
	if err != nil || tr != nil {
		t.Fatalf("NewTraining(nil) = %v, %v; want nil, nil", tr, err)
	}
	// Every method is a no-op on nil.
	tr.Step(10, 1)
	tr.Accuracy(0.5)
	tr.Eval(1, 0.5)
	tr.Close()
}

func TestTraining(t *testing.T) {
	reg := prometheus.NewRegistry()
	tr, err := NewTraining(reg)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := NewTraining(reg); !errors.As(err, new(prometheus.AlreadyRegisteredError)) {
		t.Errorf("a second training collector on one registry: %v, want AlreadyRegisteredError", err)
	}
	// Before any report: the counters at 0, no gauges.
	if n, err := testutil.GatherAndCount(reg); err != nil || n != 2 {
		t.Fatalf("before any step: %d metrics (%v), want the 2 counters", n, err)
	}
	tr.Step(32, 2.5)
	tr.Step(32, math.NaN()) // a step without a loss keeps the last one
	tr.Accuracy(0.25)
	tr.Eval(1.5, math.NaN())
	want := `
# HELP skyhive_train_steps_total Optimizer steps taken by this process's training loop.
# TYPE skyhive_train_steps_total counter
skyhive_train_steps_total 2
# HELP skyhive_train_samples_total Training examples processed (images, or sequences of a language model); rate() of it is the current throughput.
# TYPE skyhive_train_samples_total counter
skyhive_train_samples_total 64
# HELP skyhive_train_loss Training loss of the last step (cross-entropy per example, or per token for a language model).
# TYPE skyhive_train_loss gauge
skyhive_train_loss 2.5
# HELP skyhive_train_accuracy Training accuracy of the last step's batch (fraction of labels predicted), where the loop measures it.
# TYPE skyhive_train_accuracy gauge
skyhive_train_accuracy 0.25
# HELP skyhive_train_eval_loss Loss of the last evaluation on held-out data.
# TYPE skyhive_train_eval_loss gauge
skyhive_train_eval_loss 1.5
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want),
		"skyhive_train_steps_total", "skyhive_train_samples_total", "skyhive_train_loss", "skyhive_train_accuracy",
		"skyhive_train_eval_loss", "skyhive_train_eval_accuracy"); err != nil {
		t.Error(err)
	}
	if n, _ := testutil.GatherAndCount(reg, "skyhive_train_samples_per_second"); n != 1 {
		t.Errorf("%d samples_per_second gauges after steps, want 1", n)
	}
	if problems, err := testutil.GatherAndLint(reg); err != nil || len(problems) > 0 {
		t.Errorf("lint: %v %v", problems, err)
	}
	tr.Close()
	if n, _ := testutil.GatherAndCount(reg); n != 0 {
		t.Errorf("%d metrics after Close, want 0", n)
	}
}
