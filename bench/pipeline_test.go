package bench

import (
	"context"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/skyhive/skyhive/launch"
	"github.com/skyhive/skyhive/pipeline"
)

// envAsWorker makes the test binary act as `skyhive worker`, so that the
// pipeline suite's test starts real worker processes without building the
// skyhive binary.
const envAsWorker = "SKYHIVE_BENCH_TEST_WORKER"

// workerMain serves as a launched pipeline worker (the test binary stands
// in for skyhive, started as "BINARY @FILE"), until the coordinator shuts
// it down or SIGTERM arrives.
func workerMain(args []string) int {
	path, ok := launch.FileArg(args)
	if !ok {
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	if err := pipeline.RunWorkerFile(ctx, path); err != nil && ctx.Err() == nil {
		return 1
	}
	return 0
}

// The pipeline suite's case measures the even, sky and skyhive plans,
// their predictions, and the sequential schedule against 1F1B, on small
// workers: the form of the results, not their values.
func TestPipelineCase(t *testing.T) {
	if testing.Short() {
		t.Skip("starts worker processes")
	}
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	t.Setenv(envAsWorker, "1") // inherited by the workers
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	g := pipeGeometry{workers: 2, model: "deep-mlp:32x4", batch: 16, micro: 2, sched: pipeline.OneFOneB}
	res, err := pipeCase(ctx, Options{}, exe, g, true)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]Result{}
	for _, r := range res {
		if r.Suite != "pipeline" || !(r.Value > 0) {
			t.Errorf("result %+v", r)
		}
		got[r.Case+" "+r.Metric] = r
	}
	for _, s := range []string{"even", "sky", "skyhive"} {
		for _, m := range []string{"iter_time", "predicted_iter_time", "measured_vs_predicted"} {
			if _, ok := got[s+"/1f1b/2w "+m]; !ok {
				t.Errorf("no %s of %s", m, s)
			}
		}
	}
	for _, k := range []string{"skyhive/1f1b/2w speedup_vs_even", "skyhive/sequential/2w throughput", "skyhive/1f1b/2w throughput", "skyhive/sequential/2w measured_vs_predicted"} {
		if _, ok := got[k]; !ok {
			t.Errorf("no %s", k)
		}
	}
	if r := got["skyhive/1f1b/2w throughput"]; !strings.Contains(r.Note, "predicted ratio") {
		t.Errorf("1F1B throughput note %q", r.Note)
	}
}
