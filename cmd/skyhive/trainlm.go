package main

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/skyhive/skyhive/models"
	"github.com/skyhive/skyhive/tensor"
	"github.com/skyhive/skyhive/train"
)

// Defaults of language-model training, chosen for the target of
// docs/text.md (gpt-mini at ≤ 0.6 × the bigram's validation perplexity in
// lmDuration on 2 cores) from 100-step runs; 3 minutes reached 0.683 and
// 5 minutes 0.528 (docs/text.md, "Measured"). The shared flags (--batch,
// --lr, --warmup, --clip) take the model's registry defaults
// (models.DefaultsOf, lmDefaults for a GPT) unless they are given
// (withModelDefaults).
const (
	lmDuration    = 5 * time.Minute
	lmCorpusBytes = 2 << 20
	lmVocab       = 1024
	lmSeq         = 64
	lmPrompt      = "The act of"
)

// lmDefaults are a GPT's training defaults, for help texts and the flags
// of the commands that train only GPTs.
var lmDefaults = models.DefaultsOf("gpt-mini")

// lmDataFlags are the language-model data flags of every command that
// trains a language model (train, train pipeline, train averaging, peer,
// train moe, demo moe): the same names, meanings and defaults everywhere.
type lmDataFlags struct {
	corpusBytes int64
	vocab       int
	seq         int
	tokenWidth  int
	evalTokens  int
}

// lmDataOnly names lmDataFlags' flags.
var lmDataOnly = []string{"corpus-bytes", "vocab", "seq", "token-width", "eval-tokens"}

// register adds the flags; evalTokens is --eval-tokens' default.
func (l *lmDataFlags) register(fl *pflag.FlagSet, evalTokens int) {
	fl.Int64Var(&l.corpusBytes, "corpus-bytes", lmCorpusBytes, "language models: bytes of the data to read (of GCIDE, decompressed)")
	fl.IntVar(&l.vocab, "vocab", lmVocab, "language models: BPE vocabulary trained on text (the same on every peer of a swarm); with tokens:PATH, the file's vocabulary (required)")
	fl.IntVar(&l.seq, "seq", lmSeq, "language models: context length in tokens")
	fl.IntVar(&l.tokenWidth, "token-width", 2, "language models: bytes per id of a tokens:PATH file (2: uint16, 4: uint32)")
	fl.IntVar(&l.evalTokens, "eval-tokens", evalTokens, "language models: validation tokens to evaluate (0: all)")
}

// lmFlags are the options only language models have.
type lmFlags struct {
	lmDataFlags
	duration     time.Duration
	steps        int64
	prompt       string
	sampleTokens int
	temperature  float64
}

// lmOnly names the flags lmFlags adds, which image models refuse.
var lmOnly = slices.Concat([]string{"duration", "steps"}, lmDataOnly, generationOnly)

func (l *lmFlags) register(fl *pflag.FlagSet) {
	fl.DurationVar(&l.duration, "duration", lmDuration, "language models: training time (0: --steps); --time is the same flag")
	fl.Int64Var(&l.steps, "steps", 0, "language models: stop after N steps (0: --duration)")
	l.lmDataFlags.register(fl, 0)
	fl.StringVar(&l.prompt, "prompt", lmPrompt, "language models: text the generated sample starts from")
	fl.IntVar(&l.sampleTokens, "sample-tokens", 60, "language models: tokens to generate after training (0: no sample)")
	fl.Float64Var(&l.temperature, "temperature", 0.8, "language models: sampling temperature (0: greedy)")
	renameFlags(fl, map[string]string{"time": "duration"})
}

// checkImageFlags refuses the language-model flags for an image model.
func checkImageFlags(fl *pflag.FlagSet, model string) error {
	for _, name := range lmOnly {
		if fl.Changed(name) {
			return fmt.Errorf("--%s is for language models; %s is an image classifier (language models: %s)", name, model, "gpt-mini, gpt-small, gpt-medium or gpt:LAYERSxHIDDEN:VOCAB; masked: bert-mlm-mini, bert-mlm-base or bert-mlm-large")
		}
	}
	return nil
}

// generationOnly names the flags of GPT's sample, which a masked language
// model refuses.
var generationOnly = []string{"prompt", "sample-tokens", "temperature"}

// runLM trains a language model on text data in this process: a GPT with
// train.RunLM, a masked language model (BERT) with train.RunMLM.
func (f *trainFlags) runLM(cmd *cobra.Command, dataset string) error {
	fl := cmd.Flags()
	for _, name := range []string{"epochs", "limit", "data-dir"} {
		if fl.Changed(name) {
			return fmt.Errorf("--%s is for image models; a language model trains for --duration or --steps on --data %s", name, dataset)
		}
	}
	masked := models.ObjectiveOf(f.cfg.Model) == models.MaskedLM
	if masked {
		for _, name := range generationOnly {
			if fl.Changed(name) {
				return fmt.Errorf("--%s is for a GPT's generated sample; %s is a masked language model, which shows fill-mask predictions on validation text instead", name, f.cfg.Model)
			}
		}
	}
	l := f.lm
	h := withModelDefaults(fl, f.cfg.Model, models.TrainDefaults{Batch: f.cfg.BatchSize, LR: f.cfg.LR, Warmup: f.cfg.Warmup, ClipNorm: f.cfg.ClipNorm})
	cfg := train.LMConfig{
		Model: f.cfg.Model, Vocab: l.vocab, Seq: l.seq,
		BatchSize: h.Batch, LR: h.LR, WeightDecay: f.cfg.WeightDecay, Warmup: h.Warmup, ClipNorm: h.ClipNorm, Seed: f.cfg.Seed,
		Steps: l.steps, Duration: l.duration, EvalTokens: l.evalTokens,
		Prompt: l.prompt, SampleTokens: l.sampleTokens, Temperature: l.temperature,
		Checkpoint: f.cfg.Checkpoint, Resume: f.cfg.Resume, Metrics: f.cfg.Metrics,
	}
	if fl.Changed("steps") && !fl.Changed("duration") {
		cfg.Duration = 0 // --steps alone sets the run's length
	}
	if !fl.Changed("seq") && strings.Contains(cfg.Model, ":") {
		cfg.Seq = 0 // the spec's
	}
	if err := cfg.Validate(); err != nil {
		return err
	}
	tokenVocab := 0
	if strings.HasPrefix(dataset, "tokens:") {
		if !fl.Changed("vocab") {
			return fmt.Errorf("--data %s: give the vocabulary of the token file with --vocab (50257 for GPT-2's tokenizer)", dataset)
		}
		tokenVocab = l.vocab
	}
	out := cmd.ErrOrStderr()
	corpus, err := train.LoadCorpus(dataset, l.corpusBytes, l.tokenWidth, tokenVocab)
	if err != nil {
		return err
	}
	stats, closeStats, err := f.out.openStats()
	if err != nil {
		return err
	}
	defer closeStats()
	cfg.Stats = stats
	fmt.Fprintf(out, "training %s on %s, GEMM backend %s\n", cfg.Model, dataset, tensor.Backend())
	res, err := train.RunLanguageModel(cmd.Context(), cfg, corpus, out)
	if err != nil {
		return resumeHint(cmd.Context(), cfg.Checkpoint, err)
	}
	return writeResult(cmd.OutOrStdout(), res, f.out.json)
}
