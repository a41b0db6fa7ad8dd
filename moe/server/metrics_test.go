package server

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/skyhive/skyhive/moe"
	"github.com/skyhive/skyhive/wire"
)

func TestServerMetrics(t *testing.T) {
	e := newEnv(t)
	reg := prometheus.NewRegistry()
	s, err := New(Config{Transport: e.srv, Experts: []string{"ffn.0", "ffn.1"}, Hidden: 8, LR: 0.01, Seed: 3, Metrics: reg})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	x := randTensor(1, 4, 8)
	for range 2 {
		if _, err := e.call(ctx, moe.ForwardProtocol, "ffn.1", wire.Named{Name: "x", Tensor: x}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := e.call(ctx, moe.BackwardProtocol, "ffn.0", wire.Named{Name: "x", Tensor: x}, wire.Named{Name: "dy", Tensor: randTensor(2, 4, 8)}); err != nil {
		t.Fatal(err)
	}
	// A request of the wrong width is refused and counted.
	if _, err := e.call(ctx, moe.ForwardProtocol, "ffn.0", wire.Named{Name: "x", Tensor: randTensor(3, 4, 5)}); err == nil {
		t.Fatal("a request of the wrong width was answered")
	}
	want := `
# HELP skyhive_expert_experts Experts this server hosts.
# TYPE skyhive_expert_experts gauge
skyhive_expert_experts 2
# HELP skyhive_expert_requests_total Expert requests answered, by call (forward, backward).
# TYPE skyhive_expert_requests_total counter
skyhive_expert_requests_total{call="backward"} 1
skyhive_expert_requests_total{call="forward"} 2
# HELP skyhive_expert_request_errors_total Expert requests that failed or were refused (invalid, busy, failed batch), by call.
# TYPE skyhive_expert_request_errors_total counter
skyhive_expert_request_errors_total{call="backward"} 0
skyhive_expert_request_errors_total{call="forward"} 1
# HELP skyhive_expert_updates_total Optimizer steps of the experts.
# TYPE skyhive_expert_updates_total counter
skyhive_expert_updates_total 1
# HELP skyhive_expert_skipped_steps_total Expert optimizer steps skipped because their gradients were not finite.
# TYPE skyhive_expert_skipped_steps_total counter
skyhive_expert_skipped_steps_total 0
# HELP skyhive_expert_queue_requests Requests queued for a batch, over all experts.
# TYPE skyhive_expert_queue_requests gauge
skyhive_expert_queue_requests 0
# HELP skyhive_expert_queue_bytes Bytes of the input tensors of the requests queued or running (bounded by --queue-memory).
# TYPE skyhive_expert_queue_bytes gauge
skyhive_expert_queue_bytes 0
`
	names := []string{"skyhive_expert_experts", "skyhive_expert_requests_total", "skyhive_expert_request_errors_total",
		"skyhive_expert_updates_total", "skyhive_expert_skipped_steps_total", "skyhive_expert_queue_requests", "skyhive_expert_queue_bytes"}
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), names...); err != nil {
		t.Error(err)
	}
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	counts := map[string]uint64{}
	for _, f := range fams {
		for _, m := range f.GetMetric() {
			if h := m.GetHistogram(); h != nil {
				counts[f.GetName()+"/"+m.GetLabel()[0].GetValue()] = h.GetSampleCount()
			}
		}
	}
	for k, want := range map[string]uint64{
		"skyhive_expert_request_duration_seconds/forward": 2, "skyhive_expert_request_duration_seconds/backward": 1,
		"skyhive_expert_batch_rows/forward": 2, "skyhive_expert_batch_rows/backward": 1,
	} {
		if counts[k] != want {
			t.Errorf("%s: %d observations, want %d", k, counts[k], want)
		}
	}
	if problems, err := testutil.GatherAndLint(reg); err != nil || len(problems) > 0 {
		t.Errorf("lint: %v %v", problems, err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if n, _ := testutil.GatherAndCount(reg); n != 0 {
		t.Errorf("%d metrics after Close, want 0", n)
	}
}
