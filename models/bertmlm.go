package models

import (
	"fmt"
	"math/rand/v2"
	"strings"

	"github.com/skyhive/skyhive/nn"
)

// The BERT masked language models are named bert-mlm-*: "bert-large:N" and
// "bert-base:N" already name stacks of N encoder layers in package alloc's
// cost models and the profiler (skyhive profile model, skyhive plan), and
// "bert-tiny" and "bert-stack" are image classifiers of this registry.

// mlmEntry is a registry row for a named BERT masked-language-model size
// whose spec is NAME:VOCAB[xSEQ], VOCAB counting the [MASK] token. Specs
// have the bounds of GPT specs.
func mlmEntry(name, help string, size func(vocab, seq int) nn.BERTMLMConfig) entry {
	return entry{
		Model: Model{Name: name, Usage: name + ":VOCAB[xSEQ]", Help: help, Task: LanguageModeling, Objective: MaskedLM, Defaults: mlmDefaults},
		mlm: func(params string) (nn.BERTMLMConfig, error) {
			vocab, seq, err := parseVocabSeq(params)
			if err != nil {
				return nn.BERTMLMConfig{}, fmt.Errorf("%s needs %w", name, err)
			}
			return checkMLM(size(vocab, seq))
		},
	}
}

// checkMLM refuses configurations over the parameter bound.
func checkMLM(cfg nn.BERTMLMConfig) (nn.BERTMLMConfig, error) {
	if n := cfg.NumParams(); n > maxGPTParams {
		return nn.BERTMLMConfig{}, fmt.Errorf("BERT of %.0fM parameters, at most %.0fM", n/1e6, maxGPTParams/1e6)
	}
	if err := cfg.Validate(); err != nil {
		return nn.BERTMLMConfig{}, err
	}
	return cfg, nil
}

// ParseMLM returns the configuration of a masked-language-model spec
// ("bert-mlm-mini:1025x64": a vocabulary of 1025 ids, the last of them
// [MASK], and a context of 64), e.g. to learn its vocabulary, [MASK] id and
// context, or its parameter count (BERTMLMConfig.NumParams), without
// building it.
func ParseMLM(spec string) (nn.BERTMLMConfig, error) {
	e, params := lookup(spec)
	if e == nil || e.mlm == nil {
		return nn.BERTMLMConfig{}, fmt.Errorf("models: %q is not a masked language model spec (want %s)", spec, MLMUsage())
	}
	cfg, err := e.mlm(params)
	if err != nil {
		return nn.BERTMLMConfig{}, fmt.Errorf("models: bad model spec %q: %w (want %s)", spec, err, MLMUsage())
	}
	return cfg, nil
}

// BuildMLM returns a freshly initialised BERT masked language model for
// spec (see ParseMLM), seeded as Build is.
func BuildMLM(spec string, seed uint64) (*nn.Sequential, error) {
	cfg, err := ParseMLM(spec)
	if err != nil {
		return nil, err
	}
	return BuildBERTMLM(cfg, seed)
}

// BuildBERTMLM returns a freshly initialised BERT masked language model of
// cfg, seeded as Build is: BuildMLM(spec, seed) is BuildBERTMLM of the
// spec's configuration.
func BuildBERTMLM(cfg nn.BERTMLMConfig, seed uint64) (*nn.Sequential, error) {
	return nn.BERTMLM(cfg, rand.New(rand.NewPCG(seed, 0x5eed)))
}

// ObjectiveOf returns the objective of the language model that spec names,
// with or without its parameters ("bert-mlm-mini", "gpt-mini:1024x64"),
// and the zero Objective for an image classifier or a name the registry
// does not hold. It reads only the name; building checks the rest.
func ObjectiveOf(spec string) Objective {
	name, _, _ := strings.Cut(spec, ":")
	for _, e := range registry {
		if e.Name == name {
			return e.Objective
		}
	}
	return 0
}
