package pipeline

import (
	"context"
	"fmt"
	"math"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/skyhive/skyhive/models"
	"github.com/skyhive/skyhive/nn"
)

// A stack of BERT-large-geometry layers (hidden 1024, 16 heads, FFN 4096)
// trains forward and backward through the pipeline on two workers at batch
// 2. Each worker offers less memory than the whole model needs, so the
// allocator must split it: every stage fits its worker's cap, and holds
// exactly the parameters the allocator counted for it.
func TestBERTLargeGeometryOnTwoWorkers(t *testing.T) {
	if testing.Short() {
		t.Skip("builds 25M parameters per worker")
	}
	const spec, batch = "bert-stack:2x1024", 2
	cfg, err := models.BERTStackConfig("2x1024")
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Hidden != 1024 || cfg.Heads != 16 || cfg.FFN != 4096 {
		t.Fatalf("bert-stack:2x1024 is %+v, not BERT-large's geometry", cfg.BERTConfig)
	}
	ref, err := models.Build(spec, 3)
	if err != nil {
		t.Fatal(err)
	}
	am := AllocModel(spec, ref, batch, 1)
	var need int64
	for _, l := range am.Layers {
		need += l.MemBytes()
	}
	memCap := need * 3 / 4 // neither worker alone holds the model
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	// A stage's weights and optimizer state (up to 150 MB here) travel in one
	// setup message: over libp2p, as between machines (memnet caps
	// messages at 16 MiB).
	c, err := NewCoordinator(ctx, CoordinatorConfig{})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	var wg sync.WaitGroup
	defer wg.Wait()
	for i := range 2 {
		w, err := NewWorker(ctx, WorkerConfig{Name: fmt.Sprintf("w%d", i), Join: c.Addrs()[0], MemCap: memCap, Heartbeat: 200 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		defer w.Close()
		wg.Go(func() { w.Run(ctx) })
		if err := c.WaitWorkers(ctx, i+1); err != nil {
			t.Fatal(err)
		}
	}
	s, err := c.Start(ctx, SessionConfig{Model: spec, Seed: 3, Batch: batch, Micro: 1, Schedule: OneFOneB,
		Optim: OptimConfig{LR: 1e-5}, ProfileReps: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	plan := s.Plan()
	rep, err := s.Report(plan)
	if err != nil {
		t.Fatal(err)
	}
	if len(plan.Stages) != 2 || !rep.Feasible() {
		t.Fatalf("plan %+v for two workers of %d MB each, %d MB needed (report %+v)", plan.Stages, memCap>>20, need>>20, rep)
	}
	for _, sr := range rep.Stages {
		if sr.MemBytes > sr.MemCap {
			t.Fatalf("stage %+v needs %d B over its cap %d B", sr.Stage, sr.MemBytes, sr.MemCap)
		}
	}
	ds := blobs(t, 3*batch, 5)
	var losses []float64
	for _, b := range batches(t, ds, batch, 3) {
		st, err := s.Step(ctx, b)
		if err != nil {
			t.Fatal(err)
		}
		if math.IsNaN(st.Loss) || math.IsInf(st.Loss, 0) || len(st.Stages) != 2 {
			t.Fatalf("iteration %+v", st)
		}
		losses = append(losses, st.Loss)
	}
	snap, err := s.Snapshot(ctx)
	if err != nil {
		t.Fatal(err)
	}
	initial := nn.ExportParams(ref.Params())
	moved := false
	stageParams := make([]int64, len(plan.Stages))
	for name, w := range snap.Params {
		layer, err := strconv.Atoi(name[:strings.IndexByte(name, '.')])
		if err != nil {
			t.Fatalf("parameter %s", name)
		}
		for k, st := range plan.Stages {
			if layer >= st.First && layer < st.Last {
				stageParams[k] += 4 * int64(w.Len())
			}
		}
		for i, v := range w.Data {
			moved = moved || v != initial[name].Data[i]
		}
	}
	for k, st := range plan.Stages {
		var counted int64
		for _, l := range am.Layers[st.First:st.Last] {
			counted += l.ParamBytes
		}
		if counted != stageParams[k] {
			t.Errorf("stage %d holds %d parameter bytes, the allocator counted %d", k, stageParams[k], counted)
		}
	}
	if !moved {
		t.Fatalf("no parameter changed in %d steps (losses %v)", len(losses), losses)
	}
	t.Logf("plan %v, stage memory %d and %d MB of %d MB caps, losses %v", plan.Stages, rep.Stages[0].MemBytes>>20, rep.Stages[1].MemBytes>>20, memCap>>20, losses)
}
