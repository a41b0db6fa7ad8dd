package train

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/skyhive/skyhive/checkpoint"
	"github.com/skyhive/skyhive/text"
)

// sentences returns n bytes or more of seeded sentences over a small
// vocabulary, a corpus that needs no installed data.
func sentences(n int, seed uint64) []byte {
	rng := rand.New(rand.NewPCG(seed, 1))
	subj := []string{"the cat", "a dog", "the old man", "my sister", "the bird"}
	verb := []string{"sees", "likes", "follows", "finds", "hears"}
	obj := []string{"the river", "a small house", "the green tree", "her friend", "the moon"}
	var b bytes.Buffer
	for b.Len() < n {
		fmt.Fprintf(&b, "%s %s %s. ", subj[rng.IntN(len(subj))], verb[rng.IntN(len(verb))], obj[rng.IntN(len(obj))])
	}
	return b.Bytes()
}

// tinyLM is a configuration that trains in about a second.
func tinyLM(steps int64) LMConfig {
	return LMConfig{Model: "gpt-mini", Vocab: 280, Seq: 16, BatchSize: 4, LR: 3e-3, WeightDecay: 0.01, Warmup: 5,
		ClipNorm: 1, Seed: 3, Steps: steps, EvalTokens: 2000, Prompt: "the cat", SampleTokens: 8, Temperature: 0.8}
}

// A small GPT trained for a few dozen steps on a slice of GCIDE predicts
// held-out text far better than the unigram distribution, and is well on
// its way to the bigram.
func TestRunLMLearnsGCIDE(t *testing.T) {
	raw, err := text.LoadGCIDE("", 300_000)
	if err != nil {
		t.Skipf("GCIDE not installed: %v", err)
	}
	cfg := LMConfig{Model: "gpt-mini", Vocab: 320, Seq: 32, BatchSize: 16, LR: 3e-3, WeightDecay: 0.01, Warmup: 10,
		ClipNorm: 1, Seed: 1, Steps: 60, EvalTokens: 8000}
	res, err := RunLM(context.Background(), cfg, Corpus{Name: "gcide", Text: raw}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("after %d steps (%.1fs): perplexity %.2f, bigram %.2f, unigram %.2f", res.Steps, res.Seconds, res.ValPerplexity, res.BigramPerplexity, res.UnigramPerplexity)
	// At 60 steps the model is at 37.7 against the unigram's 83.6 and the
	// bigram's 24.3.
	if res.Steps != 60 || !(res.ValPerplexity < 0.6*res.UnigramPerplexity) {
		t.Errorf("perplexity %.2f after %d steps, want < 0.6 × the unigram's %.2f", res.ValPerplexity, res.Steps, res.UnigramPerplexity)
	}
	if !(res.BigramPerplexity < res.UnigramPerplexity) || res.Ratio != res.ValPerplexity/res.BigramPerplexity || res.EvalTokens != 8000-8000%32 {
		t.Errorf("references: %+v", res)
	}
}

// The same seed gives the same run; a checkpointed model reloads with its
// tokenizer and evaluates the same; and a run interrupted halfway and
// resumed ends exactly where an uninterrupted one does.
func TestRunLMCheckpointAndResume(t *testing.T) {
	corpus := Corpus{Name: "text:sentences", Text: sentences(40_000, 1)}
	dir := t.TempDir()
	cfg := tinyLM(20)
	cfg.Checkpoint = filepath.Join(dir, "whole.safetensors")
	whole, err := RunLM(context.Background(), cfg, corpus, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if whole.Sample == "" || whole.Steps != 20 || whole.Model != "gpt-mini:280x16" {
		t.Fatalf("result %+v", whole)
	}

	lm, err := LoadLM(cfg.Checkpoint)
	if err != nil {
		t.Fatal(err)
	}
	if lm.Spec != whole.Model || lm.Steps != 20 || lm.Tokenizer == nil || lm.Tokenizer.VocabSize() != 280 || lm.Data != corpus.Name {
		t.Fatalf("loaded %+v", lm)
	}
	ids := lm.Tokenizer.Encode(corpus.Text)
	_, val, _ := text.Split(ids, 0.1, cfg.Seed)
	val = val[:whole.EvalTokens+1]
	loss, err := EvaluateLM(context.Background(), lm.Model, val, lm.Config.Seq, cfg.BatchSize)
	if err != nil || math.Abs(loss-whole.ValLoss) > 1e-6 {
		t.Fatalf("reloaded model's validation loss %v (%v), the run's %v", loss, err, whole.ValLoss)
	}
	gen, err := Generate(context.Background(), lm.Model, lm.Config, lm.Tokenizer.Encode([]byte(cfg.Prompt)), cfg.SampleTokens, cfg.Temperature, cfg.Seed)
	if err != nil {
		t.Fatal(err)
	}
	if s, _ := lm.Tokenizer.Decode(gen); string(s) != whole.Sample {
		t.Errorf("reloaded model's sample %q, the run's %q", s, whole.Sample)
	}

	// Interrupt a second run after step 10: the report of step 10 cancels
	// the context, and the next step saves instead.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	cfg.Checkpoint = filepath.Join(dir, "resumed.safetensors")
	cfg.Resume = true
	cfg.Stats = cancelAt{step: 10, cancel: cancel}
	if _, err := RunLM(ctx, cfg, corpus, io.Discard); !errors.Is(err, context.Canceled) || !strings.Contains(err.Error(), "resume") {
		t.Fatalf("interrupted run: %v", err)
	}
	if f, err := checkpoint.Load(cfg.Checkpoint); err != nil || f.Meta[metaLMStep] != "10" {
		t.Fatalf("interrupted checkpoint: %v", err)
	}
	cfg.Stats = nil
	resumed, err := RunLM(context.Background(), cfg, corpus, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if !resumed.Resumed || resumed.Steps != 20 || resumed.ValLoss != whole.ValLoss || resumed.Sample != whole.Sample {
		t.Errorf("resumed run: steps %d, loss %v, sample %q; uninterrupted: loss %v, sample %q",
			resumed.Steps, resumed.ValLoss, resumed.Sample, whole.ValLoss, whole.Sample)
	}
}

// cancelAt is a stats writer that cancels when it sees the report of step.
type cancelAt struct {
	step   int
	cancel context.CancelFunc
}

func (c cancelAt) Write(b []byte) (int, error) {
	if bytes.Contains(b, fmt.Appendf(nil, `"step":%d,`, c.step)) {
		c.cancel()
	}
	return len(b), nil
}

// Bad input is an error that says what to do.
func TestRunLMBadInput(t *testing.T) {
	dir := t.TempDir()
	empty := filepath.Join(dir, "empty.txt")
	if err := os.WriteFile(empty, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadCorpus("text:"+empty, 0, 2, 0); !errors.Is(err, text.ErrEmpty) || !strings.Contains(err.Error(), "give a file with text") {
		t.Errorf("empty text file: %v", err)
	}
	tokens := filepath.Join(dir, "train.bin")
	if err := text.WriteTokenFile(tokens, []int32{1, 2, 3000, 4}, 2); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadCorpus("tokens:"+tokens, 0, 2, 1000); err == nil || !strings.Contains(err.Error(), "token id 3000 at position 2") || !strings.Contains(err.Error(), "--vocab") {
		t.Errorf("id beyond the vocabulary: %v", err)
	}
	if c, err := LoadCorpus("tokens:"+tokens, 0, 2, 4000); err != nil || !slices.Equal(c.Tokens, []int32{1, 2, 3000, 4}) {
		t.Errorf("token file: %v, %v", c.Tokens, err)
	}
	for _, spec := range []string{"text:", "tokens:", "gcide:", "words:x"} {
		if _, err := LoadCorpus(spec, 0, 2, 10); err == nil {
			t.Errorf("%q: no error", spec)
		}
	}

	cases := []struct {
		name   string
		cfg    func(*LMConfig)
		corpus Corpus
		want   string
	}{
		{"empty text", nil, Corpus{Name: "text:x", Text: []byte{}}, "no text"},
		{"no data", nil, Corpus{Name: "tokens:x"}, "no text or tokens"},
		{"too short", nil, Corpus{Name: "text:x", Text: []byte("a few words")}, "--corpus-bytes"},
		{"image model", func(c *LMConfig) { c.Model = "mlp" }, Corpus{Name: "text:x", Text: sentences(5000, 1)}, "not a language model"},
		{"id beyond vocab", nil, Corpus{Name: "tokens:x", Tokens: []int32{1, 2, 9, 3}, Vocab: 8}, "outside the vocabulary of 8"},
		{"vocab too small", func(c *LMConfig) { c.Vocab = 100 }, Corpus{Name: "text:x", Text: sentences(5000, 1)}, "at least 256"},
		{"spec vocab too small", func(c *LMConfig) { c.Model = "gpt-mini:260x16" }, Corpus{Name: "text:x", Text: sentences(5000, 1)}, "larger one"},
		{"spec and seq differ", func(c *LMConfig) { c.Model = "gpt-mini:280x32" }, Corpus{Name: "text:x", Text: sentences(5000, 1)}, "--seq is 16"},
		{"no length", func(c *LMConfig) { c.Steps = 0 }, Corpus{Name: "text:x", Text: sentences(5000, 1)}, "duration or a number of steps"},
	}
	for _, c := range cases {
		cfg := tinyLM(1)
		if c.cfg != nil {
			c.cfg(&cfg)
		}
		_, err := RunLM(context.Background(), cfg, c.corpus, io.Discard)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: error %v, want one containing %q", c.name, err, c.want)
		}
	}
}
