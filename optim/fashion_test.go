package optim

import (
	"errors"
	"io/fs"
	"math/rand/v2"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/skyhive/skyhive/data"
	"github.com/skyhive/skyhive/nn"
)

// TestFashionMNIST trains a Fashion-MNIST model for a few epochs with AdamW
// and checks the test accuracy. It needs the dataset (data.DefaultDir) and
// is skipped with -short. SKYHIVE_FASHION_EPOCHS overrides the epoch count
// and SKYHIVE_FASHION_MODEL=bert selects the image BERT.
func TestFashionMNIST(t *testing.T) {
	if testing.Short() {
		t.Skip("trains on Fashion-MNIST")
	}
	train, err := data.LoadFashionMNIST("", data.Train, data.LoadOptions{Standardize: true})
	if errors.Is(err, fs.ErrNotExist) {
		t.Skipf("Fashion-MNIST not installed: %v", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	test, err := data.LoadFashionMNIST("", data.Test, data.LoadOptions{Standardize: true})
	if err != nil {
		t.Fatal(err)
	}
	epochs, want := 1, 0.84
	if s := os.Getenv("SKYHIVE_FASHION_EPOCHS"); s != "" {
		epochs, _ = strconv.Atoi(s)
		want = 0
	}
	rng := rand.New(rand.NewPCG(1, 1))
	m := nn.MLP([]int{784, 512, 256, 10}, 0.1, rng)
	lr := 1e-3
	if os.Getenv("SKYHIVE_FASHION_MODEL") == "bert" {
		cfg := nn.ImageBERTTiny()
		if p, err := strconv.Atoi(os.Getenv("SKYHIVE_FASHION_PATCH")); err == nil {
			cfg.Patch = p
		}
		lr = 2e-3
		m, err = nn.ImageBERT(cfg, rng)
		if err != nil {
			t.Fatal(err)
		}
	}
	const batch = 128
	loader, err := data.NewLoader(train, data.BatchOptions{Size: batch, Shuffle: true, Seed: 2, DropLast: true})
	if err != nil {
		t.Fatal(err)
	}
	o := NewAdamW(m.Params(), AdamWConfig{LR: lr, WeightDecay: 0.01, NoDecay: NoDecayVectors})
	total := int64(epochs * loader.Len())
	sched := Schedule{Peak: lr, Min: lr / 50, Warmup: 100, Total: total, Decay: Cosine}
	start := time.Now()
	var step int64
	for ep := range epochs {
		for _, b := range loader.Epoch(ep) {
			o.ZeroGrad()
			y, st := m.Forward(nn.Ctx{Train: true}, b.X)
			_, dy := nn.SoftmaxCrossEntropy(y, b.Y)
			m.Backward(st, dy)
			o.SetLR(sched.LR(step))
			o.Step()
			step++
		}
		acc := evaluate(m, test)
		t.Logf("epoch %d: test accuracy %.4f after %v", ep+1, acc, time.Since(start).Round(time.Second))
		if ep == epochs-1 && acc < want {
			t.Errorf("test accuracy %.4f, want ≥ %.2f", acc, want)
		}
	}
}

func evaluate(m nn.Module, d *data.Dataset) float64 {
	const bs = 1000
	hit := 0.0
	for lo := 0; lo < d.Len(); lo += bs {
		hi := min(lo+bs, d.Len())
		part := d.Slice(lo, hi)
		y, _ := m.Forward(nn.Ctx{}, part.X)
		hit += nn.Accuracy(y, part.Y) * float64(hi-lo)
	}
	return hit / float64(d.Len())
}
