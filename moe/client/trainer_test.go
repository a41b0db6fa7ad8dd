package client_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/skyhive/skyhive/data"
	"github.com/skyhive/skyhive/moe"
	"github.com/skyhive/skyhive/moe/client"
	"github.com/skyhive/skyhive/moe/server"
	"github.com/skyhive/skyhive/moe/sim"
	"github.com/skyhive/skyhive/optim"
	"github.com/skyhive/skyhive/p2p"
)

// newTrainer starts a small simulated swarm (one DMoE layer of 2×2
// experts of hidden 8 on two servers, 2 ms RTT) and a Trainer over a
// learnable 4-class problem whose trainers are peers of that swarm.
func newTrainer(t *testing.T, trainers, round int) (*client.Trainer, *sim.Swarm, *data.Dataset) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	grids := []moe.Grid{{Prefix: "ffn", Size: []int{2, 2}}}
	sw, err := sim.New(ctx, sim.Config{Grids: grids, Servers: 2, RTT: 2 * time.Millisecond,
		Server: server.Config{Hidden: 8, Lazy: true, LR: 1e-3, Seed: 1, DeclareEvery: time.Minute}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sw.Close() })
	ds, err := data.GaussianBlobs(640, 16, 4, 7)
	if err != nil {
		t.Fatal(err)
	}
	trainSet, testSet := ds.Slice(0, 512), ds.Slice(512, 640)
	tr, err := client.NewTrainer(ctx, client.TrainerConfig{
		Model: client.ModelConfig{Inputs: 16, Hidden: 8, Classes: 4, Grids: grids, CacheTTL: time.Minute, Seed: 3,
			Layer: client.Config{KBest: 2, KMin: 2, ForwardTimeout: 5 * time.Second, BackwardTimeout: 5 * time.Second}},
		Connect:   func(ctx context.Context) (p2p.Transport, client.Getter, error) { return sw.NewTrainer(ctx) },
		Trainers:  trainers,
		Round:     round,
		Optimizer: optim.AdamWConfig{LR: 1e-2},
		Train:     trainSet, Batch: 16, Seed: 5,
		EvalTimeout: 10 * time.Second,
	})
	if err != nil {
		t.Fatal(err)
	}
	return tr, sw, testSet
}

func expertRequests(sw *sim.Swarm) (forward, backward int64) {
	for _, s := range sw.Servers {
		for _, e := range s.Stats().Experts {
			forward += e.Forward.Requests
			backward += e.Backward.Requests
		}
	}
	return forward, backward
}

// Three trainers sharing one stream learn the task: the loss of the last
// epoch is below a fifth of the first's, the test accuracy is far above
// chance (and above what the experts reach alone),
// no step fails, and every step called the experts forward and backward.
func TestTrainerEpochsLearn(t *testing.T) {
	tr, sw, testSet := newTrainer(t, 3, 1)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var losses []float64
	var steps int64
	var calls atomic.Int64
	err := tr.TrainEpochs(ctx, client.EpochOptions{
		Epochs: 3,
		LR:     optim.Schedule{Peak: 1e-2, Min: 1e-3, Warmup: 5, Total: int64(3 * tr.EpochLen()), Decay: optim.Cosine},
		OnEpoch: func(_ context.Context, epoch int, s client.Stats) error {
			calls.Add(1)
			if s.Failed > 0 {
				t.Errorf("epoch %d: %d of %d steps failed: %v", epoch, s.Failed, s.Steps, s.Err)
			}
			if s.Steps != int64(tr.EpochLen()) || s.Samples != 16*s.Steps {
				t.Errorf("epoch %d: %d steps of %d samples, want %d steps of 16", epoch, s.Steps, s.Samples, tr.EpochLen())
			}
			losses = append(losses, s.MeanLoss())
			steps += s.Steps
			return nil
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	if calls.Load() != 3 {
		t.Fatalf("OnEpoch called %d times, want 3", calls.Load())
	}
	if got := tr.Shared().Steps(); got != steps {
		t.Errorf("%d optimizer steps for %d trainer steps with rounds of 1", got, steps)
	}
	if losses[2] > 0.2*losses[0] {
		t.Errorf("mean loss per epoch %v: did not fall to a fifth", losses)
	}
	_, acc, err := tr.Evaluate(ctx, testSet)
	if err != nil {
		t.Fatal(err)
	}
	if acc < 0.9 {
		t.Errorf("test accuracy %.2f after 3 epochs, want at least 0.9 (chance 0.25; 0.76 when only the experts learn)", acc)
	}
	// KBest 2 of 4 experts: each step sends its batch to at least two
	// experts, and as many backward calls follow.
	fw, bw := expertRequests(sw)
	if fw < 2*steps || bw < 2*steps {
		t.Errorf("%d forward and %d backward expert calls for %d steps, want at least %d each", fw, bw, steps, 2*steps)
	}
}

// RunFor trains every trainer on its shard until the budget is spent,
// ticks meanwhile, and takes one optimizer step per round of two steps.
func TestTrainerRunForRounds(t *testing.T) {
	tr, _, testSet := newTrainer(t, 2, 2)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var ticks atomic.Int64
	st, err := tr.RunFor(ctx, client.RunOptions{
		Budget:  1500 * time.Millisecond,
		LR:      optim.Schedule{Peak: 1e-2, Min: 1e-3, Warmup: 75, Total: 1500, Decay: optim.Cosine},
		Stagger: 50 * time.Millisecond,
		Every:   400 * time.Millisecond,
		OnTick: func(at time.Duration, s client.Stats) {
			ticks.Add(1)
			if _, _, err := tr.Evaluate(ctx, testSet); err != nil {
				t.Errorf("evaluate at %v: %v", at, err)
			}
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	if st.Elapsed < 1500*time.Millisecond {
		t.Errorf("run took %v, less than its budget", st.Elapsed)
	}
	if n := ticks.Load(); n < 2 {
		t.Errorf("%d ticks in 1.5 s every 0.4 s", n)
	}
	if st.Failed > 0 {
		t.Errorf("%d of %d steps failed: %v", st.Failed, st.Steps, st.Err)
	}
	ok := st.Samples / 16
	if ok < 10 {
		t.Fatalf("only %d successful steps in 1.5 s", ok)
	}
	if got := tr.Shared().Steps(); got != ok/2 {
		t.Errorf("%d optimizer steps for %d successful trainer steps in rounds of 2, want %d", got, ok, ok/2)
	}
}
