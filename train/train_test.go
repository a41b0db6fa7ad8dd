package train

import (
	"context"
	"io"
	"path/filepath"
	"strings"
	"testing"

	"github.com/skyhive/skyhive/checkpoint"
	"github.com/skyhive/skyhive/data"
)

// blobs returns train and test sets of one synthetic task.
func blobs(t *testing.T, nTrain, nTest int) (trainSet, testSet *data.Dataset) {
	t.Helper()
	ds, err := data.GaussianBlobs(nTrain+nTest, data.ImageSize, data.NumClasses, 1)
	if err != nil {
		t.Fatal(err)
	}
	testSet, trainSet, err = ds.Split(nTest, 2)
	if err != nil {
		t.Fatal(err)
	}
	return trainSet, testSet
}

func testConfig(dir string) Config {
	return Config{Model: "mlp", Epochs: 2, BatchSize: 32, LR: 1e-3, Warmup: 5, ClipNorm: 5, Seed: 7,
		Checkpoint: filepath.Join(dir, "ck.safetensors")}
}

func TestRunLearnsAndCheckpoints(t *testing.T) {
	trainSet, testSet := blobs(t, 640, 200)
	cfg := testConfig(t.TempDir())
	res, err := Run(context.Background(), cfg, trainSet, testSet, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if res.TestAccuracy < 0.9 {
		t.Fatalf("accuracy %.3f on separable blobs, want ≥ 0.9", res.TestAccuracy)
	}
	f, err := checkpoint.Load(cfg.Checkpoint)
	if err != nil || !f.Verified {
		t.Fatalf("checkpoint not saved or unverified: %v", err)
	}
	if f.Meta[metaEpoch] != "2" || f.Meta[metaModel] != "mlp" {
		t.Fatalf("checkpoint metadata %v", f.Meta)
	}
}

func TestInterruptThenResume(t *testing.T) {
	trainSet, testSet := blobs(t, 640, 200)
	cfg := testConfig(t.TempDir())
	ctx, cancel := context.WithCancel(context.Background())
	cancel() // interrupted before the first step: checkpoint at epoch 0, batch 0
	if _, err := Run(ctx, cfg, trainSet, testSet, io.Discard); err == nil {
		t.Fatal("cancelled run returned no error")
	}
	f, err := checkpoint.Load(cfg.Checkpoint)
	if err != nil {
		t.Fatalf("no checkpoint after interrupt: %v", err)
	}
	if f.Meta[metaEpoch] != "0" || f.Meta[metaBatch] != "0" {
		t.Fatalf("interrupt position %v", f.Meta)
	}
	cfg.Resume = true
	res, err := Run(context.Background(), cfg, trainSet, testSet, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if !res.Resumed || len(res.Epochs) != 2 {
		t.Fatalf("resumed=%v epochs=%d, want resumed with 2 epochs", res.Resumed, len(res.Epochs))
	}
	// Resuming a finished run trains nothing more and keeps the accuracy.
	again, err := Run(context.Background(), cfg, trainSet, testSet, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if len(again.Epochs) != 0 || again.TestAccuracy != res.TestAccuracy {
		t.Fatalf("second resume trained %d epochs, accuracy %.4f vs %.4f", len(again.Epochs), again.TestAccuracy, res.TestAccuracy)
	}
}

func TestResumeRejectsOtherModel(t *testing.T) {
	trainSet, testSet := blobs(t, 64, 32)
	cfg := testConfig(t.TempDir())
	cfg.Epochs = 1
	if _, err := Run(context.Background(), cfg, trainSet, testSet, io.Discard); err != nil {
		t.Fatal(err)
	}
	cfg.Model, cfg.Resume = "bert-tiny", true
	if _, err := Run(context.Background(), cfg, trainSet, testSet, io.Discard); err == nil {
		t.Fatal("resumed an mlp checkpoint into bert-tiny")
	}
}

func TestConfigValidate(t *testing.T) {
	bad := []Config{
		{Model: "mlp", Epochs: 0, BatchSize: 1, LR: 1},
		{Model: "mlp", Epochs: 1, BatchSize: 0, LR: 1},
		{Model: "mlp", Epochs: 1, BatchSize: 1, LR: 0},
		{Model: "mlp", Epochs: 1, BatchSize: 1, LR: 1, Resume: true},
	}
	for _, c := range bad {
		if c.Validate() == nil {
			t.Errorf("%+v accepted", c)
		}
	}
	unknown := Config{Model: "resnet", Epochs: 1, BatchSize: 1, LR: 1}
	if _, err := Run(context.Background(), unknown, nil, nil, io.Discard); err == nil || !strings.Contains(err.Error(), "resnet") {
		t.Errorf("unknown model: %v", err)
	}
}
