package pipeline

import (
	"bytes"
	"context"
	"fmt"
	"math"
	"os"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/skyhive/skyhive/alloc"
	"github.com/skyhive/skyhive/data"
	"github.com/skyhive/skyhive/models"
	"github.com/skyhive/skyhive/nn"
	"github.com/skyhive/skyhive/optim"
	"github.com/skyhive/skyhive/p2p/memnet"
	"github.com/skyhive/skyhive/stats"
	"github.com/skyhive/skyhive/tensor"
)

func TestMain(m *testing.M) {
	if os.Getenv(envAsWorker) == "1" {
		os.Exit(workerMain(os.Args[1:])) // a worker process of a Scenario test
	}
	// One GEMM engine for the whole test process: the default one sends a
	// product to the Go kernel while another is inside OpenBLAS, so which
	// engine computes what (and the last bits of the result) would depend
	// on how the in-process workers interleave, and the comparison with a
	// single process would vary from run to run.
	if err := tensor.SelectBackend("go"); err != nil {
		panic(err)
	}
	goleak.VerifyTestMain(m,
		goleak.IgnoreAnyFunction("github.com/ipfs/go-log/v2/writer.(*MirrorWriter).logRoutine"),
		goleak.IgnoreAnyFunction("go.opencensus.io/stats/view.(*worker).start"),
	)
}

// cluster is a coordinator with in-process workers, all peers of one
// in-memory network.
type cluster struct {
	net     *memnet.Network
	c       *Coordinator
	workers []*Worker
	cancel  context.CancelFunc
	wg      sync.WaitGroup
}

func newCluster(t *testing.T, slowdowns ...float64) *cluster {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	net := memnet.NewNetwork()
	peer := func() *memnet.Peer {
		p, err := net.NewPeer()
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	c, err := NewCoordinator(ctx, CoordinatorConfig{Transport: peer()})
	if err != nil {
		t.Fatal(err)
	}
	cl := &cluster{net: net, c: c, cancel: cancel}
	t.Cleanup(func() {
		cancel()
		for _, w := range cl.workers {
			w.Close()
		}
		cl.wg.Wait()
		c.Close()
		net.Close()
	})
	for i, f := range slowdowns {
		w, err := NewWorker(ctx, WorkerConfig{Name: fmt.Sprintf("w%d", i), Join: c.Addrs()[0], Transport: peer(), Slowdown: f, Heartbeat: 200 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		cl.workers = append(cl.workers, w)
		cl.wg.Go(func() { w.Run(ctx) })
		// Register in order, so worker i has index i.
		wctx, wcancel := context.WithTimeout(ctx, 10*time.Second)
		err = c.WaitWorkers(wctx, i+1)
		wcancel()
		if err != nil {
			t.Fatal(err)
		}
	}
	return cl
}

func blobs(t *testing.T, n int, seed uint64) *data.Dataset {
	t.Helper()
	ds, err := data.GaussianBlobs(n, InputFeatures, data.NumClasses, seed)
	if err != nil {
		t.Fatal(err)
	}
	return ds
}

func batches(t *testing.T, ds *data.Dataset, size, count int) []data.Batch {
	t.Helper()
	l, err := data.NewLoader(ds, data.BatchOptions{Size: size, Shuffle: true, Seed: 3, DropLast: true})
	if err != nil {
		t.Fatal(err)
	}
	var out []data.Batch
	for e := 0; len(out) < count; e++ {
		for _, b := range l.Epoch(e) {
			if len(out) < count {
				out = append(out, b)
			}
		}
	}
	return out
}

// reference trains the model in one process with the same micro-batch
// gradient accumulation, clipping and learning rates.
func reference(t *testing.T, cfg SessionConfig, bs []data.Batch) map[string]*tensor.Tensor {
	t.Helper()
	model, err := models.Build(cfg.Model, cfg.Seed)
	if err != nil {
		t.Fatal(err)
	}
	params := model.Params()
	opt := cfg.Optim.NewOptimizer(params)
	m := cfg.Schedule.Micro(cfg.Micro)
	for _, b := range bs {
		opt.ZeroGrad()
		n, lo := b.Len(), 0
		for j := range m {
			hi := lo + n/m + btoi(j < n%m)
			logits, st := model.Forward(nn.Ctx{Train: true}, rows(b.X, lo, hi))
			_, dl := nn.SoftmaxCrossEntropy(logits, b.Y[lo:hi])
			tensor.Scale(float32(hi-lo)/float32(n), dl.Data)
			model.Backward(st, dl)
			lo = hi
		}
		if cfg.ClipNorm > 0 {
			optim.ClipGradNorm(params, cfg.ClipNorm)
		}
		opt.SetLR(cfg.Optim.LR)
		opt.Step()
	}
	return nn.ExportParams(params)
}

func TestOps(t *testing.T) {
	for _, s := range []Schedule{Sequential, GPipe, OneFOneB} {
		for stages := 1; stages <= 5; stages++ {
			for m := 1; m <= 6; m++ {
				for k := range stages {
					ops := Ops(s, k, stages, m)
					mm := s.Micro(m)
					if len(ops) != 2*mm {
						t.Fatalf("%v stage %d/%d m=%d: %d ops", s, k, stages, m, len(ops))
					}
					seenF, seenB, inflight, peak := 0, 0, 0, 0
					for _, op := range ops {
						if op.Backward {
							if op.Micro != seenB || op.Micro >= seenF {
								t.Fatalf("%v stage %d/%d m=%d: %v out of order in %v", s, k, stages, m, op, ops)
							}
							seenB++
							inflight--
						} else {
							if op.Micro != seenF {
								t.Fatalf("%v stage %d/%d m=%d: %v out of order in %v", s, k, stages, m, op, ops)
							}
							seenF++
							inflight++
						}
						peak = max(peak, inflight)
					}
					if s == OneFOneB && peak > min(stages-k, mm) {
						t.Fatalf("1f1b stage %d/%d m=%d holds %d micro-batches: %v", k, stages, m, peak, ops)
					}
				}
			}
		}
	}
	if got := fmt.Sprint(Ops(OneFOneB, 0, 3, 4)); got != "[F0 F1 F2 B0 F3 B1 B2 B3]" {
		t.Fatalf("1f1b stage 0 of 3: %s", got)
	}
	if got := fmt.Sprint(Ops(OneFOneB, 2, 3, 4)); got != "[F0 B0 F1 B1 F2 B2 F3 B3]" {
		t.Fatalf("1f1b last stage: %s", got)
	}
}

// TestSchedulesMatchSingleProcess trains 3 stages on an in-memory network
// with each schedule and compares every parameter with
// single-process training of the same model.
func TestSchedulesMatchSingleProcess(t *testing.T) {
	cases := []struct {
		model    string
		schedule Schedule
		micro    int
		plan     []alloc.Stage
		optim    OptimConfig
		clip     float64
	}{
		{"deep-mlp:48x4", Sequential, 1, []alloc.Stage{{Device: 0, First: 0, Last: 3}, {Device: 1, First: 3, Last: 6}, {Device: 2, First: 6, Last: 9}}, OptimConfig{LR: 1e-2}, 0},
		{"deep-mlp:48x4", GPipe, 4, []alloc.Stage{{Device: 2, First: 0, Last: 2}, {Device: 0, First: 2, Last: 7}, {Device: 1, First: 7, Last: 9}}, OptimConfig{Kind: "sgd", LR: 0.05, Momentum: 0.9}, 0.5},
		{"deep-mlp:48x4", OneFOneB, 4, []alloc.Stage{{Device: 0, First: 0, Last: 4}, {Device: 1, First: 4, Last: 5}, {Device: 2, First: 5, Last: 9}}, OptimConfig{LR: 1e-2, WeightDecay: 0.01}, 1},
		// The Fashion-MNIST MLP has dropout: each layer draws its masks
		// in micro-batch order under every schedule. SGD, because Adam
		// turns the last-bit differences of the GEMM engines that
		// concurrent in-process workers use into whole steps on weights
		// whose gradient is near zero.
		{"mlp", OneFOneB, 3, []alloc.Stage{{Device: 1, First: 0, Last: 3}, {Device: 2, First: 3, Last: 5}, {Device: 0, First: 5, Last: 7}}, OptimConfig{Kind: "sgd", LR: 0.05}, 0},
	}
	ds := blobs(t, 200, 5)
	for _, tc := range cases {
		t.Run(fmt.Sprintf("%s/%s", tc.model, tc.schedule), func(t *testing.T) {
			cl := newCluster(t, 1, 1, 1)
			ctx, cancel := context.WithTimeout(context.Background(), 40*time.Second)
			defer cancel()
			cfg := SessionConfig{
				Model: tc.model, Seed: 11, Batch: 30, Micro: tc.micro, Schedule: tc.schedule,
				Optim: tc.optim, ClipNorm: tc.clip, Plan: &alloc.Plan{Stages: tc.plan}, ProfileReps: 1,
			}
			s, err := cl.c.Start(ctx, cfg)
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			bs := batches(t, ds, 30, 4)
			for _, b := range bs {
				st, err := s.Step(ctx, b)
				if err != nil {
					t.Fatal(err)
				}
				if len(st.Stages) != 3 || st.Event != "" {
					t.Fatalf("unexpected iteration %+v", st)
				}
			}
			snap, err := s.Snapshot(ctx)
			if err != nil {
				t.Fatal(err)
			}
			want := reference(t, s.cfg, bs)
			if len(snap.Params) != len(want) {
				t.Fatalf("pipeline has %d parameters, reference %d", len(snap.Params), len(want))
			}
			init, _ := models.Build(tc.model, 11)
			initial := nn.ExportParams(init.Params())
			moved := 0.0
			for name, w := range want {
				got := snap.Params[name]
				if got == nil {
					t.Fatalf("parameter %s missing", name)
				}
				for i := range w.Data {
					d := math.Abs(float64(got.Data[i] - w.Data[i]))
					if d > 1e-5+1e-4*math.Abs(float64(w.Data[i])) {
						t.Fatalf("%s[%d] = %v, single process %v", name, i, got.Data[i], w.Data[i])
					}
					moved = max(moved, math.Abs(float64(w.Data[i]-initial[name].Data[i])))
				}
			}
			if moved < 1e-4 {
				t.Fatalf("training did not change the parameters (max change %g)", moved)
			}
			if snap.Step != 4 {
				t.Fatalf("optimizer step %d, want 4", snap.Step)
			}
		})
	}
}

// TestWorkerDeathReplans kills a stage mid-training: the coordinator must
// re-plan on the remaining workers, restore the lost layers from its
// checkpoint and continue from the loss it had reached.
func TestWorkerDeathReplans(t *testing.T) {
	cl := newCluster(t, 1, 1, 1)
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Second)
	defer cancel()
	var log bytes.Buffer
	s, err := cl.c.Start(ctx, SessionConfig{
		Model: "deep-mlp:64x4", Seed: 3, Batch: 32, Micro: 2, Schedule: GPipe,
		Optim: OptimConfig{LR: 2e-4}, Strategy: "even", CheckpointEvery: 4,
		IterTimeout: 10 * time.Second, ProfileReps: 1, Log: &log,
	})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	bs := batches(t, blobs(t, 320, 9), 32, 20)
	var losses []float64
	killed := -1
	for i, b := range bs {
		if i == 10 {
			// Kill the middle stage's worker: its layers exist only there
			// and in the checkpoint of iteration 8.
			killed = s.stages[1].worker
			if err := cl.net.Kill(cl.workers[killed].ID()); err != nil {
				t.Fatal(err)
			}
		}
		st, err := s.Step(ctx, b)
		if err != nil {
			t.Fatalf("step %d: %v\n%s", i, err, log.String())
		}
		if i == 10 && st.Event == "" {
			t.Fatalf("no re-plan reported after the kill\n%s", log.String())
		}
		losses = append(losses, st.Loss)
	}
	if len(s.stages) != 2 {
		t.Fatalf("%d stages after losing one of 3 workers", len(s.stages))
	}
	for _, a := range s.stages {
		if a.worker == killed {
			t.Fatal("dead worker still in the plan")
		}
	}
	if s.Iter() != len(bs) {
		t.Fatalf("%d iterations committed, want %d", s.Iter(), len(bs))
	}
	before := (losses[7] + losses[8] + losses[9]) / 3
	after := (losses[10] + losses[11] + losses[12]) / 3
	t.Logf("loss: first %.3f, before kill %.3f, after %.3f, last %.3f\n%s", losses[0], before, after, losses[len(losses)-1], log.String())
	if !(before < 0.7*losses[0]) {
		t.Fatalf("training did not progress before the kill: %v", losses)
	}
	if !(after < 0.7*losses[0]) || after > before+0.5*(losses[0]-before) {
		t.Fatalf("loss jumped back after the re-plan: %v", losses)
	}
}

// TestDriftReplans slows a worker down 8× during training: the coordinator
// must measure the slowdown and move layers away from the worker. Every
// worker is an emulated device driftBase× slower than its compute on this
// machine, as in the pipeline bench: an emulated device's speed is its
// ops' busy time (see opClock) times its slowdown, which other load on the
// machine hardly changes (as long as the worker gets 1/driftBase of a
// core). The drift rule itself is unit-tested in drift_test.go, the op
// clock and the throttle in opclock_test.go.
func TestDriftReplans(t *testing.T) {
	if testing.Short() {
		t.Skip("timing-based")
	}
	const driftBase, slowdown = 3, 8
	cl := newCluster(t, driftBase, driftBase, driftBase)
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Second)
	defer cancel()
	var log bytes.Buffer
	s, err := cl.c.Start(ctx, SessionConfig{
		Model: "deep-mlp:256x6", Seed: 3, Batch: 64, Schedule: Sequential,
		Optim: OptimConfig{LR: 1e-3}, Strategy: "sky", ReplanThreshold: 0.5, ReplanPatience: 3,
		ProfileReps: 3, Log: &log,
	})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	layersOf := func(w int) int {
		for _, a := range s.stages {
			if a.worker == w {
				return a.last - a.first
			}
		}
		return 0
	}
	bs := batches(t, blobs(t, 1280, 4), 64, 40)
	// Every worker's measured FLOP/s on the plan it runs when slowed down
	// (iteration 0 warms up), and the slowed worker's after that.
	before := map[string][]float64{}
	var after []float64
	slow, name, layers, quiet := -1, "", 0, 0
	for i, b := range bs {
		// Slow a worker down once the drift detector has a baseline: some
		// iterations after the last re-plan (early iterations, warming up,
		// may re-plan on their own).
		if slow < 0 && i >= 6 && quiet > driftBaselineIter {
			// The worker with the most layers: one that holds a single
			// layer has none to give.
			for _, a := range s.stages {
				if slow < 0 || a.last-a.first > layersOf(slow) {
					slow = a.worker
				}
			}
			name, layers = s.c.worker(slow).Name, layersOf(slow)
			cl.workers[slow].SetSlowdown(driftBase * slowdown)
			t.Logf("iteration %d: %s, holding %d layers, slowed down %d×", i, name, layers, slowdown)
		}
		st, err := s.Step(ctx, b)
		if err != nil {
			t.Fatalf("step %d: %v\n%s", i, err, log.String())
		}
		quiet++
		if st.Event != "" && slow < 0 {
			quiet, before = 0, map[string][]float64{} // on the new plan from now
			continue
		}
		for _, g := range st.Stages {
			switch {
			case !(g.Speed > 0):
			case slow >= 0 && g.Worker == name:
				after = append(after, g.Speed)
			case slow < 0 && i >= 1:
				before[g.Worker] = append(before[g.Worker], g.Speed)
			}
		}
		if slow >= 0 && st.Event != "" && layersOf(slow) < layers {
			measured := stats.Median(before[name]) / stats.Median(after)
			t.Logf("emulated slowdown %d×, measured %.1f×; after iteration %d: %s", slowdown, measured, i, st.Event)
			if measured < slowdown/3. || measured > 3*slowdown {
				t.Fatalf("emulated slowdown %d× measured as %.1f× (speeds %v before, %v after)\n%s", slowdown, measured, before[name], after, log.String())
			}
			return
		}
	}
	t.Fatalf("no re-plan moved layers off the slowed worker %q (it holds %d, %d before the slowdown)\n%s", name, layersOf(slow), layers, log.String())
}
