package main

import (
	"github.com/spf13/pflag"

	"github.com/skyhive/skyhive/models"
	"github.com/skyhive/skyhive/train"
)

// lmDefaults are a GPT's training defaults (models.DefaultsOf), for help
// texts and the flags of the commands that train only GPTs; the other
// defaults of language-model training are package train's.
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

// register adds the flags; evalTokens is --eval-tokens' default.
func (l *lmDataFlags) register(fl *pflag.FlagSet, evalTokens int) {
	fl.Int64Var(&l.corpusBytes, "corpus-bytes", train.DefaultCorpusBytes, "language models: bytes of the data to read (of GCIDE, decompressed)")
	fl.IntVar(&l.vocab, "vocab", train.DefaultVocab, "language models: BPE vocabulary trained on text (the same on every peer of a swarm); with tokens:PATH, the file's vocabulary (required)")
	fl.IntVar(&l.seq, "seq", train.DefaultSeq, "language models: context length in tokens")
	fl.IntVar(&l.tokenWidth, "token-width", 2, "language models: bytes per id of a tokens:PATH file (2: uint16, 4: uint32)")
	fl.IntVar(&l.evalTokens, "eval-tokens", evalTokens, "language models: validation tokens to evaluate (0: all)")
}

// lmFlags are the options only language models have: their data, and
// the run's length and sample (Duration, Steps, Prompt, SampleTokens,
// Temperature of cfg).
type lmFlags struct {
	lmDataFlags
	cfg train.LMConfig
}

func (l *lmFlags) register(fl *pflag.FlagSet) {
	fl.DurationVar(&l.cfg.Duration, "duration", train.DefaultLMDuration, "language models: training time (0: --steps); --time is the same flag")
	fl.Int64Var(&l.cfg.Steps, "steps", 0, "language models: stop after N steps (0: --duration)")
	l.lmDataFlags.register(fl, 0)
	fl.StringVar(&l.cfg.Prompt, "prompt", train.DefaultPrompt, "language models: text the generated sample starts from")
	fl.IntVar(&l.cfg.SampleTokens, "sample-tokens", 60, "language models: tokens to generate after training (0: no sample)")
	fl.Float64Var(&l.cfg.Temperature, "temperature", 0.8, "language models: sampling temperature (0: greedy)")
	renameFlags(fl, map[string]string{"time": "duration"})
}
