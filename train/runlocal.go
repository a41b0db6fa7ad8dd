package train

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/skyhive/skyhive/data"
	"github.com/skyhive/skyhive/jsonl"
	"github.com/skyhive/skyhive/launch"
	"github.com/skyhive/skyhive/metrics"
	"github.com/skyhive/skyhive/models"
	"github.com/skyhive/skyhive/tensor"
)

// Local configures RunLocal: training in this process, as `skyhive train`
// runs it. Errors about its options are *launch.FieldError naming them
// by their snake_case names (data_dir, corpus_bytes, sample_tokens, …),
// which the command maps to its flags.
type Local struct {
	// Config is the run's model and optimizer. For a language model its
	// BatchSize, LR, Warmup and ClipNorm give way to the model's registry
	// defaults (models.DefaultsOf) unless they were given.
	Config
	// Data is the data set: fashion-mnist for image models, text data
	// (TextDataUsage) for language models; not given, a language model
	// trains on gcide.
	Data string
	// DataDir and Limit locate Fashion-MNIST and bound its training set.
	DataDir string
	Limit   int
	// LM is a language model's run: its Vocab, Seq, Steps, Duration,
	// EvalTokens and sample (the rest comes from Config). Seq not given
	// is the model spec's, where the spec has one; Steps given alone sets
	// the run's length (Duration 0).
	LM LMConfig
	// CorpusBytes and TokenWidth say how to read text data (LoadCorpus).
	CorpusBytes int64
	TokenWidth  int
	// JSON prints the result as JSON; Stats is a file JSON lines are
	// appended to while the run runs ("": none).
	JSON  bool
	Stats string
	// MetricsAddr, if set, serves the run's Prometheus metrics on
	// http://MetricsAddr/metrics (metrics.Start; Config.Metrics is then
	// its registry).
	MetricsAddr string
	// Given reports whether an option was given, by its snake_case name;
	// nil: none was.
	Given func(option string) bool
}

// imageOnly names the options only image models have.
var imageOnly = []string{"epochs", "limit", "data_dir"}

// lmOnly names the options only language models have, which image models
// refuse.
var lmOnly = []string{"duration", "steps", "corpus_bytes", "vocab", "seq", "token_width", "eval_tokens", "prompt", "sample_tokens", "temperature"}

// generationOnly names the options of a GPT's sample, which a masked
// language model refuses.
var generationOnly = []string{"prompt", "sample_tokens", "temperature"}

// lmModels lists the language models, for the error that refuses their
// options to an image model.
const lmModels = "gpt-mini, gpt-small, gpt-medium or gpt:LAYERSxHIDDEN:VOCAB; masked: bert-mlm-mini, bert-mlm-base or bert-mlm-large"

// RunLocal trains c's model in this process: a language model on text
// with RunLanguageModel, an image model on Fashion-MNIST with Run. It
// refuses an unknown model, data that does not fit the model and options
// of the other kind of model before it reads anything; then it prints the
// progress on stderr and the result on stdout, as text or JSON, serving
// the run's metrics while it runs.
func RunLocal(ctx context.Context, c Local, stdout, stderr io.Writer) error {
	if c.Given == nil {
		c.Given = func(string) bool { return false }
	}
	reg, stopMetrics, err := metrics.Start(ctx, c.MetricsAddr, stderr)
	if err != nil {
		return &launch.FieldError{Fields: []string{"metrics"}, Text: "%s", Err: err}
	}
	defer stopMetrics()
	if reg != nil {
		c.Metrics = reg.Registerer()
	}
	if err := KnownModel(c.Model); err != nil {
		return err
	}
	lm, dataset := IsLanguageModel(c.Model), c.Data
	if lm && !c.Given("data") {
		dataset = "gcide"
	}
	textData := IsTextData(dataset)
	switch {
	case lm && dataset == "fashion-mnist":
		return &launch.FieldError{Fields: []string{"data", "model"}, Text: c.Model + " is a language model and fashion-mnist is images: train it on text (%s " +
			TextDataUsage + "), or train an image model (%s " + models.Usage() + ") on fashion-mnist"}
	case lm && textData:
		return c.runLM(ctx, dataset, stdout, stderr)
	case textData:
		return &launch.FieldError{Fields: []string{"model"}, Text: c.Model + " is an image classifier and " + dataset +
			" is text: train a language model on it (%s gpt-mini), or train " + c.Model + " on fashion-mnist"}
	case dataset != "fashion-mnist":
		return fmt.Errorf("unknown data set %q (supported: fashion-mnist for image models; %s for language models)", dataset, TextDataUsage)
	}
	for _, o := range lmOnly {
		if c.Given(o) {
			return &launch.FieldError{Fields: []string{o}, Text: "%s is for language models; " + c.Model + " is an image classifier (language models: " + lmModels + ")"}
		}
	}
	return c.runImage(ctx, stdout, stderr)
}

// KnownModel reports a model spec whose name the registry does not know,
// suggesting the closest name when one is a likely typo, and listing the
// names (their parameters are checked when the model is built); the error
// is a *launch.FieldError about option model.
func KnownModel(spec string) error {
	known, best, names := ClosestModel(spec)
	if known {
		return nil
	}
	hint := ""
	if best != "" {
		hint = fmt.Sprintf(" (did you mean %s?)", best)
	}
	return &launch.FieldError{Fields: []string{"model"},
		Text: "%s " + spec + ": unknown model" + hint + "; the models are " + strings.Join(names, ", ") + " (skyhive train --help describes them)"}
}

// runImage trains an image model on Fashion-MNIST.
func (c Local) runImage(ctx context.Context, stdout, stderr io.Writer) error {
	if err := c.Config.Validate(); err != nil {
		return err
	}
	if c.Limit < 0 {
		return &launch.FieldError{Fields: []string{"limit"}, Text: fmt.Sprintf("%%s must not be negative, got %d", c.Limit)}
	}
	trainSet, err := data.LoadFashionMNIST(c.DataDir, data.Train, data.LoadOptions{Standardize: true, Limit: c.Limit})
	if err != nil {
		return err
	}
	testSet, err := data.LoadFashionMNIST(c.DataDir, data.Test, data.LoadOptions{Standardize: true})
	if err != nil {
		return err
	}
	stats, closeStats, err := openStats(c.Stats)
	if err != nil {
		return err
	}
	defer closeStats()
	cfg := c.Config
	cfg.Stats = stats
	input := data.FashionMNISTPreprocessing(true) // loaded standardized
	cfg.Input = &input
	fmt.Fprintf(stderr, "training %s on Fashion-MNIST: %d train / %d test examples, GEMM backend %s\n",
		cfg.Model, trainSet.Len(), testSet.Len(), tensor.Backend())
	res, err := Run(ctx, cfg, trainSet, testSet, stderr)
	if err != nil {
		return err
	}
	if res.Resumed && len(res.Epochs) == 0 && !c.JSON {
		fmt.Fprintf(stdout, "%s has finished all %d epochs: nothing left to do (test accuracy %.2f%%; raise --epochs to train further)\n",
			cfg.Checkpoint, cfg.Epochs, 100*res.TestAccuracy)
		return nil
	}
	return writeResult(stdout, res, c.JSON)
}

// runLM trains a language model on text data: a GPT with RunLM, a masked
// language model (BERT) with RunMLM.
func (c Local) runLM(ctx context.Context, dataset string, stdout, stderr io.Writer) error {
	for _, o := range imageOnly {
		if c.Given(o) {
			return &launch.FieldError{Fields: []string{o, "duration", "steps", "data"},
				Text: "%s is for image models; a language model trains for %s or %s on %s " + dataset}
		}
	}
	if models.ObjectiveOf(c.Model) == models.MaskedLM {
		for _, o := range generationOnly {
			if c.Given(o) {
				return &launch.FieldError{Fields: []string{o}, Text: "%s is for a GPT's generated sample; " + c.Model +
					" is a masked language model, which shows fill-mask predictions on validation text instead"}
			}
		}
	}
	cfg := c.lmConfig()
	if err := cfg.Validate(); err != nil {
		return err
	}
	tokenVocab := 0
	if strings.HasPrefix(dataset, "tokens:") {
		if !c.Given("vocab") {
			return &launch.FieldError{Fields: []string{"data", "vocab"},
				Text: "%s " + dataset + ": give the vocabulary of the token file with %s (50257 for GPT-2's tokenizer)"}
		}
		tokenVocab = c.LM.Vocab
	}
	corpus, err := LoadCorpus(dataset, c.CorpusBytes, c.TokenWidth, tokenVocab)
	if err != nil {
		return err
	}
	stats, closeStats, err := openStats(c.Stats)
	if err != nil {
		return err
	}
	defer closeStats()
	cfg.Stats = stats
	fmt.Fprintf(stderr, "training %s on %s, GEMM backend %s\n", cfg.Model, dataset, tensor.Backend())
	res, err := RunLanguageModel(ctx, cfg, corpus, stderr)
	if err != nil {
		return err
	}
	return writeResult(stdout, res, c.JSON)
}

// lmConfig is the language model's run: LM with Config's model, optimizer
// and checkpoint, the model's registry defaults for the optimizer options
// not given, and the run's length and context as the options given say.
func (c Local) lmConfig() LMConfig {
	cfg := c.LM
	cfg.Model, cfg.WeightDecay, cfg.Seed = c.Model, c.WeightDecay, c.Seed
	cfg.BatchSize, cfg.LR, cfg.Warmup, cfg.ClipNorm = c.BatchSize, c.LR, c.Warmup, c.ClipNorm
	cfg.Checkpoint, cfg.Resume, cfg.Metrics = c.Checkpoint, c.Resume, c.Metrics
	d := models.ApplyDefaults(c.Model, c.Given, models.TrainDefaults{Batch: cfg.BatchSize, LR: cfg.LR, Warmup: cfg.Warmup, ClipNorm: cfg.ClipNorm})
	cfg.BatchSize, cfg.LR, cfg.Warmup, cfg.ClipNorm = d.Batch, d.LR, d.Warmup, d.ClipNorm
	if c.Given("steps") && !c.Given("duration") {
		cfg.Duration = 0 // Steps alone sets the run's length
	}
	if !c.Given("seq") && strings.Contains(cfg.Model, ":") {
		cfg.Seq = 0 // the spec's
	}
	return cfg
}

// openStats opens the stats file for appending: a nil writer and a no-op
// close without one.
func openStats(path string) (io.Writer, func() error, error) {
	w, closeFile, err := jsonl.Open(path)
	if err != nil {
		return nil, nil, &launch.FieldError{Fields: []string{"stats"}, Text: "%s", Err: err}
	}
	return w, closeFile, nil
}

// writeResult prints a result as indented JSON, or as text.
func writeResult(w io.Writer, r TextWriter, asJSON bool) error {
	if !asJSON {
		r.WriteText(w)
		return nil
	}
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(r)
}

// Defaults of language-model training, chosen for the target of
// docs/text.md (gpt-mini at ≤ 0.6 × the bigram's validation perplexity in
// DefaultLMDuration on 2 cores) from 100-step runs; 3 minutes reached
// 0.683 and 5 minutes 0.528 (docs/text.md, "Measured"). The optimizer's
// options take the model's registry defaults (models.DefaultsOf) unless
// they are given.
const (
	DefaultLMDuration  = 5 * time.Minute
	DefaultCorpusBytes = 2 << 20
	DefaultVocab       = 1024
	DefaultSeq         = 64
	DefaultPrompt      = "The act of"
)
