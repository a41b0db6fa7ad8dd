package pipeline

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/skyhive/skyhive/data"
)

func TestBatchesCycleEpochs(t *testing.T) {
	l, err := data.NewLoader(blobs(t, 50, 2), data.BatchOptions{Size: 16, Shuffle: true, Seed: 1, DropLast: true})
	if err != nil {
		t.Fatal(err)
	}
	b := NewBatches(l)
	var ends []int
	for i := range 7 {
		if _, end := b.Next(); end {
			ends = append(ends, i)
		}
	}
	if len(ends) != 2 || ends[0] != 2 || ends[1] != 5 || b.Epoch() != 2 {
		t.Fatalf("epoch ends at %v, epoch now %d; want [2 5] and 2 (3 batches an epoch)", ends, b.Epoch())
	}
}

// smallSession starts a session of a two-layer MLP with batch 32 in two
// micro-batches (1F1B) on in-process workers of the given slowdowns.
func smallSession(t *testing.T, lr float64, slowdowns ...float64) (context.Context, *Session) {
	t.Helper()
	cl := newCluster(t, slowdowns...)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	s, err := cl.c.Start(ctx, SessionConfig{
		Model: "deep-mlp:32x2", Seed: 3, Batch: 32, Micro: 2, Schedule: OneFOneB,
		Optim: OptimConfig{LR: lr}, Strategy: "even", ProfileReps: 1,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	return ctx, s
}

// TestTrainLoop trains a small model for a few epochs through Train: the
// loss falls, every hook fires at its cadence, the stats are written and
// the final parameters are evaluated.
func TestTrainLoop(t *testing.T) {
	ctx, s := smallSession(t, 3e-3, 1, 1)
	ds := blobs(t, 480, 4)
	test, train, err := ds.Split(160, 4)
	if err != nil {
		t.Fatal(err)
	}
	l, err := data.NewLoader(train, data.BatchOptions{Size: 32, Shuffle: true, Seed: 4, DropLast: true})
	if err != nil {
		t.Fatal(err)
	}
	const epochs = 3
	var before, iters []int
	var epochLoss []float64
	var stats bytes.Buffer
	res, err := s.Train(ctx, TrainOptions{
		Data: NewBatches(l), Epochs: epochs, Eval: test, Stats: &stats,
		BeforeStep:  func(_ context.Context, iter int) error { before = append(before, iter); return nil },
		OnIteration: func(st IterStats) error { iters = append(iters, st.Iter); return nil },
		OnEpoch: func(epoch int, loss float64) error {
			if epoch != len(epochLoss) {
				t.Errorf("epoch %d reported after %d epochs", epoch, len(epochLoss))
			}
			epochLoss = append(epochLoss, loss)
			return nil
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	want := epochs * l.Len()
	if res.Iterations != want || res.Ran != want || len(before) != want || len(iters) != want || s.Iter() != want {
		t.Fatalf("%d iterations, %d BeforeStep and %d OnIteration calls; want %d each", res.Iterations, len(before), len(iters), want)
	}
	for i := range want {
		if before[i] != i || iters[i] != i {
			t.Fatalf("call %d: BeforeStep saw iteration %d, OnIteration %d", i, before[i], iters[i])
		}
	}
	if len(epochLoss) != epochs {
		t.Fatalf("OnEpoch fired %d times, want %d", len(epochLoss), epochs)
	}
	if !(epochLoss[epochs-1] < 0.8*epochLoss[0]) {
		t.Errorf("mean loss per epoch %v does not fall", epochLoss)
	}
	if res.Last.Iter != want-1 || res.Duration <= 0 {
		t.Errorf("last %+v, duration %v", res.Last, res.Duration)
	}
	if res.TestAccuracy < 0.5 || res.TestLoss <= 0 {
		t.Errorf("test loss %v, accuracy %v: the model did not learn", res.TestLoss, res.TestAccuracy)
	}
	dec := json.NewDecoder(&stats)
	lines := 0
	for ; dec.More(); lines++ {
		var st IterStats
		if err := dec.Decode(&st); err != nil {
			t.Fatal(err)
		}
		if st.Iter != lines {
			t.Fatalf("stats line %d is iteration %d", lines, st.Iter)
		}
	}
	if lines != want {
		t.Errorf("%d stats lines, want %d", lines, want)
	}

	// A further call continues to a step count and a hook's error stops it.
	stop := errors.New("stop")
	res, err = s.Train(ctx, TrainOptions{Data: NewBatches(l), Steps: want + 5,
		BeforeStep: func(_ context.Context, iter int) error {
			if iter == want+2 {
				return stop
			}
			return nil
		}})
	if !errors.Is(err, stop) || s.Iter() != want+2 {
		t.Fatalf("stopped at iteration %d with %v; want %d and the hook's error", s.Iter(), err, want+2)
	}
	if _, err := s.Train(ctx, TrainOptions{Data: NewBatches(l)}); err == nil {
		t.Error("Train without steps or epochs accepted")
	}
}
