// Package models is the model registry: the named Fashion-MNIST classifiers
// that every training mode (local, pipeline, group averaging) and the
// profiler build, the GPT language models, and the BERT masked language
// models that local training builds. A spec is a plain name
// ("mlp") or a name with parameters ("deep-mlp:512x16",
// "gpt-mini:4096x128"); the same spec and seed give the same weights in
// every process, which is how peers and pipeline workers agree on a model
// without sending it. A model's Task says which data it takes.
package models

import (
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"

	"github.com/skyhive/skyhive/data"
	"github.com/skyhive/skyhive/nn"
)

// InputFeatures is the per-example input size of every image classifier
// (Task ImageClassification): a flattened 28×28 image. Every classifier
// maps [batch, InputFeatures] inputs to [batch, Classes] logits.
const InputFeatures = data.ImageSize

// Classes is the number of logits every image classifier outputs.
const Classes = data.NumClasses

// Task is the kind of data a model learns from.
type Task int

const (
	// ImageClassification models map [batch, InputFeatures] images to
	// [batch, Classes] logits; train them with nn.SoftmaxCrossEntropy.
	ImageClassification Task = iota
	// LanguageModeling models map [batch, seq] float32 token ids (seq at
	// most the spec's SEQ, ids in [0, VOCAB)) to [batch, seq, VOCAB]
	// logits. Their Objective says what the logits predict: for CausalLM
	// (GPT) the next token, trained with nn.SequenceCrossEntropy on the
	// inputs and targets of nn.NextTokenTargets; for MaskedLM (BERT) the
	// original token at masked positions, trained with
	// nn.MaskedSequenceCrossEntropy.
	LanguageModeling
)

// Objective is what a language model learns to predict. Image classifiers
// have none (the zero Objective).
type Objective int

const (
	// CausalLM models (GPT) predict each position's next token from the
	// tokens up to it.
	CausalLM Objective = iota + 1
	// MaskedLM models (BERT) predict the original tokens of masked
	// positions from the whole sequence on both sides. They reserve their
	// last token id, VOCAB−1, as [MASK] (nn.BERTMLMConfig.MaskID).
	MaskedLM
)

// String returns "causal-lm", "masked-lm", or "none" for the zero
// Objective. "masked-lm" is also the task a masked language model's
// checkpoint records.
func (o Objective) String() string {
	switch o {
	case 0:
		return "none"
	case CausalLM:
		return "causal-lm"
	case MaskedLM:
		return "masked-lm"
	}
	return fmt.Sprintf("Objective(%d)", int(o))
}

// String returns "image classification" or "language modeling".
func (t Task) String() string {
	switch t {
	case ImageClassification:
		return "image classification"
	case LanguageModeling:
		return "language modeling"
	}
	return fmt.Sprintf("Task(%d)", int(t))
}

// Size bounds of "deep-mlp" specs, so that a peer cannot make a worker build
// an absurd model.
const (
	maxDeepWidth = 8192
	maxDeepDepth = 256
)

// Model describes one entry of the registry.
type Model struct {
	// Name is the part of a spec before any ':' ("deep-mlp").
	Name string
	// Usage is how a spec is written: the name, or for a parameterised
	// model the name and a pattern ("deep-mlp:WIDTHxDEPTH").
	Usage string
	// Help says what the model is.
	Help string
	// Task is the kind of data the model takes.
	Task Task
	// Objective is what a language model predicts (zero for an image
	// classifier).
	Objective Objective
	// Defaults are the model's own training hyperparameters, which the
	// commands use unless their flags are given (zero fields: the
	// command's defaults).
	Defaults TrainDefaults
}

// TrainDefaults are training hyperparameters a model needs other than the
// commands' defaults (which suit the image classifiers). A zero field
// takes the command's.
type TrainDefaults struct {
	// Batch is the examples (sequences) per step.
	Batch int
	// LR is the peak learning rate.
	LR float64
	// Warmup is the linear learning-rate warm-up in steps.
	Warmup int64
	// ClipNorm is the global gradient-norm clip.
	ClipNorm float64
}

// Language models' training defaults, chosen for the target of
// docs/text.md (gpt-mini at ≤ 0.6 × the bigram's validation perplexity in
// 5 minutes on 2 cores) from 100-step runs (docs/text.md, "Measured").
// BERT's post-LN encoder falls back to the unigram and stays there at a
// learning rate of 1.5e-3 and above on small runs
// (train.TestRunMLMBeatsUnigram), so a masked language model trains at a
// third of GPT's rate.
var (
	gptDefaults = TrainDefaults{Batch: 16, LR: 3e-3, Warmup: 100, ClipNorm: 1}
	mlmDefaults = TrainDefaults{Batch: 16, LR: 1e-3, Warmup: 100, ClipNorm: 1}
)

// DefaultsOf returns the training defaults of the model that spec names,
// with or without its parameters ("gpt-mini", "gpt-mini:1024x64"), and
// zero ones for a name the registry does not hold. It reads only the
// name.
func DefaultsOf(spec string) TrainDefaults {
	name, _, _ := strings.Cut(spec, ":")
	for _, e := range registry {
		if e.Name == name {
			return e.Defaults
		}
	}
	return TrainDefaults{}
}

// ApplyDefaults returns values, the training options a command was given
// or defaults to, with each replaced by the registry default of the model
// that spec names (DefaultsOf) where the model has one and given, called
// with the option's name (batch, lr, warmup or clip), says it was not
// given.
func ApplyDefaults(spec string, given func(option string) bool, values TrainDefaults) TrainDefaults {
	d := DefaultsOf(spec)
	if d.Batch > 0 && !given("batch") {
		values.Batch = d.Batch
	}
	if d.LR > 0 && !given("lr") {
		values.LR = d.LR
	}
	if d.Warmup > 0 && !given("warmup") {
		values.Warmup = d.Warmup
	}
	if d.ClipNorm > 0 && !given("clip") {
		values.ClipNorm = d.ClipNorm
	}
	return values
}

// Bounds of GPT and BERT MLM specs, so that a peer cannot make a worker
// build an absurd model: gpt-medium with GPT-2's vocabulary (50257) and
// context (1024) has 355M parameters.
const (
	maxGPTVocab  = 1 << 17
	maxGPTSeq    = 4096
	maxGPTLayers = 128
	maxGPTHidden = 4096
	maxGPTParams = 400e6
	// gptHeadDim is the head size of "gpt:" specs, as in GPT-2 and BERT.
	gptHeadDim = 64
)

// DefaultSeq is the context length of a language-model spec that gives no
// SEQ.
const DefaultSeq = 128

// entry is a registry row: its description and its builder, which gets the
// text after the ':' of the spec ("" for plain names) and the seeded
// generator that all of a model's initialisation draws from. Language
// models have instead gpt (causal) or mlm (masked), which turns the text
// after the ':' into a configuration; their build is nn.GPT or nn.BERTMLM
// of it.
type entry struct {
	Model
	build func(params string, rng *rand.Rand) (*nn.Sequential, error)
	gpt   func(params string) (nn.GPTConfig, error)
	mlm   func(params string) (nn.BERTMLMConfig, error)
}

// registry is the fixed table of models, in the order List gives them.
var registry = [...]entry{
	{Model: Model{"mlp", "mlp", "784-512-256-10 MLP with dropout 0.1 (536k parameters)", ImageClassification, 0, TrainDefaults{}}, build: plain(buildMLP)},
	{Model: Model{"mlp-small", "mlp-small", "784-128-10 MLP without dropout (102k parameters), light for swarms of many peers", ImageClassification, 0, TrainDefaults{}}, build: plain(buildMLPSmall)},
	{Model: Model{"bert-tiny", "bert-tiny", "BERT-style classifier of 7×7 patches: hidden 64, 4 heads, 2 layers (72k parameters)", ImageClassification, 0, TrainDefaults{}}, build: plain(buildBERTTiny)},
	{Model: Model{"deep-mlp", "deep-mlp:WIDTHxDEPTH", fmt.Sprintf("DEPTH equal hidden layers (Linear+ReLU) of WIDTH units, no dropout; width ≤ %d, depth ≤ %d", maxDeepWidth, maxDeepDepth), ImageClassification, 0, TrainDefaults{}}, build: buildDeepMLP},
	{Model: Model{"bert-stack", "bert-stack:LAYERSxHIDDEN", bertStackHelp, ImageClassification, 0, TrainDefaults{}}, build: buildBERTStack},
	gptEntry("gpt-mini", "GPT language model over VOCAB tokens, context SEQ (default 128): 4 blocks of hidden 128, 4 heads, FFN 512, no dropout (0.79M + 128·(VOCAB+SEQ) parameters); trains in minutes on 2 cores", nn.GPTMini),
	gptEntry("gpt-small", "GPT-2 small (BERT-base geometry): 12 blocks of hidden 768, 12 heads, dropout 0.1 (85M + 768·(VOCAB+SEQ) parameters)", nn.GPTSmall),
	gptEntry("gpt-medium", "GPT-2 medium (BERT-large geometry): 24 blocks of hidden 1024, 16 heads, dropout 0.1 (302M + 1024·(VOCAB+SEQ) parameters)", nn.GPTMedium),
	{Model: Model{"gpt", "gpt:LAYERSxHIDDEN:VOCAB[xSEQ]", fmt.Sprintf("GPT of LAYERS blocks of HIDDEN units (a multiple of %d; HIDDEN/%d heads, FFN 4·HIDDEN, dropout 0.1); at most %d layers, hidden %d, vocab %d, context %d and %.0fM parameters", gptHeadDim, gptHeadDim, maxGPTLayers, maxGPTHidden, maxGPTVocab, maxGPTSeq, maxGPTParams/1e6), LanguageModeling, CausalLM, gptDefaults}, gpt: parseCustomGPT},
	mlmEntry("bert-mlm-mini", "BERT masked language model over VOCAB tokens ([MASK] is VOCAB−1; a size without parameters gets the tokenizer's vocabulary + 1), context SEQ (default 128): 4 layers of hidden 128, 4 heads, FFN 512, no dropout (0.81M + 128·(VOCAB+SEQ) parameters); trains in minutes on 2 cores", nn.BERTMLMMini),
	mlmEntry("bert-mlm-base", "BERT-base masked language model: 12 layers of hidden 768, 12 heads, dropout 0.1 (86M + 768·(VOCAB+SEQ) parameters)", nn.BERTMLMBase),
	mlmEntry("bert-mlm-large", "BERT-large masked language model: 24 layers of hidden 1024, 16 heads, dropout 0.1 (303M + 1024·(VOCAB+SEQ) parameters)", nn.BERTMLMLarge),
}

// List returns the registry's models in a fixed order.
func List() []Model {
	out := make([]Model, len(registry))
	for i, e := range registry {
		out[i] = e.Model
	}
	return out
}

// Usage lists the image classifiers' specs, which every image mode takes,
// for help texts and error messages: "mlp, mlp-small, bert-tiny or
// deep-mlp:WIDTHxDEPTH". LMUsage lists the causal language models',
// MLMUsage the masked ones'.
func Usage() string {
	return usage(func(m Model) bool { return m.Task == ImageClassification })
}

// LMUsage lists the causal language models' (GPT) specs, which every
// language-model mode takes: "gpt-mini:VOCAB[xSEQ], … or
// gpt:LAYERSxHIDDEN:VOCAB[xSEQ]".
func LMUsage() string { return usage(func(m Model) bool { return m.Objective == CausalLM }) }

// MLMUsage lists the masked language models' (BERT) specs, which local
// training takes: "bert-mlm-mini:VOCAB[xSEQ], … or
// bert-mlm-large:VOCAB[xSEQ]".
func MLMUsage() string { return usage(func(m Model) bool { return m.Objective == MaskedLM }) }

func usage(keep func(Model) bool) string {
	var us []string
	for _, e := range registry {
		if keep(e.Model) {
			us = append(us, e.Usage)
		}
	}
	if len(us) < 2 {
		return strings.Join(us, "")
	}
	return strings.Join(us[:len(us)-1], ", ") + " or " + us[len(us)-1]
}

// Help returns one line per model of task, its usage and what it is, each
// line starting with indent. The language models' lines list the causal
// models, then the masked ones.
func Help(task Task, indent string) string {
	width := 0
	for _, e := range registry {
		width = max(width, len(e.Usage))
	}
	var b strings.Builder
	for _, e := range registry {
		if e.Task == task {
			fmt.Fprintf(&b, "%s%-*s  %s\n", indent, width, e.Usage, e.Help)
		}
	}
	return b.String()
}

// lookup returns the entry that spec names, or nil.
func lookup(spec string) (*entry, string) {
	name, params, hasParams := strings.Cut(spec, ":")
	for i := range registry {
		e := &registry[i]
		if e.Name == name && hasParams == strings.Contains(e.Usage, ":") {
			return e, params
		}
	}
	return nil, ""
}

// Lookup returns the registry entry that spec names, e.g. to learn its
// Task before building it. It checks the name and whether parameters are
// given, not the parameters themselves (Build and ParseGPT do).
func Lookup(spec string) (Model, error) {
	e, _ := lookup(spec)
	if e == nil {
		return Model{}, fmt.Errorf("models: unknown model %q (want %s)", spec, Usage())
	}
	return e.Model, nil
}

// Build returns a freshly initialised image classifier for spec (see
// List), its weights drawn from a PCG generator seeded with seed: the same
// spec and seed give the same weights in every process. A language-model
// spec is an error: the image modes (local training, pipeline workers,
// averaging peers, the profiler) take [batch, InputFeatures] images, and a
// peer must not make another build a model of another kind. Language
// models are built with BuildLM (GPT) and BuildMLM (BERT).
func Build(spec string, seed uint64) (*nn.Sequential, error) {
	e, params := lookup(spec)
	if e == nil {
		return nil, fmt.Errorf("models: unknown model %q (want %s)", spec, Usage())
	}
	if e.Task == LanguageModeling {
		return nil, fmt.Errorf("models: %q is a language model; this mode trains the image classifiers %s", spec, Usage())
	}
	m, err := e.build(params, rand.New(rand.NewPCG(seed, 0x5eed)))
	if err != nil {
		return nil, fmt.Errorf("models: bad model spec %q: %w (want %s)", spec, err, Usage())
	}
	return m, nil
}

// BuildLM returns a freshly initialised causal language model (GPT) for
// spec (see ParseGPT), seeded as Build is. A masked language model's spec
// is an error: BuildMLM builds those.
func BuildLM(spec string, seed uint64) (*nn.Sequential, error) {
	cfg, err := ParseGPT(spec)
	if err != nil {
		return nil, err
	}
	return BuildGPT(cfg, seed)
}

// BuildGPT returns a freshly initialised GPT of cfg, seeded as Build is:
// BuildLM(spec, seed) is BuildGPT of the spec's configuration. It is for
// callers that change the configuration a spec gives, as package pipeline
// unties the head of the models it splits across machines.
func BuildGPT(cfg nn.GPTConfig, seed uint64) (*nn.Sequential, error) {
	return nn.GPT(cfg, rand.New(rand.NewPCG(seed, 0x5eed)))
}

// ParseGPT returns the configuration of a causal language-model spec
// ("gpt-mini:4096x128", "gpt:6x256:8000"), e.g. to learn its vocabulary
// and context length, or its parameter count (GPTConfig.NumParams), without
// building it. A masked language model's spec is an error that says so
// (ParseMLM parses those).
func ParseGPT(spec string) (nn.GPTConfig, error) {
	e, params := lookup(spec)
	if e != nil && e.mlm != nil {
		return nn.GPTConfig{}, fmt.Errorf("models: %q is a masked language model (BERT), which only local training (skyhive train) trains; this needs a GPT: %s", spec, LMUsage())
	}
	if e == nil || e.gpt == nil {
		return nn.GPTConfig{}, fmt.Errorf("models: %q is not a language model spec (want %s)", spec, LMUsage())
	}
	cfg, err := e.gpt(params)
	if err != nil {
		return nn.GPTConfig{}, fmt.Errorf("models: bad model spec %q: %w (want %s)", spec, err, LMUsage())
	}
	return cfg, nil
}

// gptEntry is a registry row for a named GPT size whose spec is
// NAME:VOCAB[xSEQ].
func gptEntry(name, help string, size func(vocab, seq int) nn.GPTConfig) entry {
	return entry{
		Model: Model{Name: name, Usage: name + ":VOCAB[xSEQ]", Help: help, Task: LanguageModeling, Objective: CausalLM, Defaults: gptDefaults},
		gpt: func(params string) (nn.GPTConfig, error) {
			vocab, seq, err := parseVocabSeq(params)
			if err != nil {
				return nn.GPTConfig{}, fmt.Errorf("%s needs %w", name, err)
			}
			return checkGPT(size(vocab, seq))
		},
	}
}

// parseVocabSeq parses "VOCAB" or "VOCABxSEQ".
func parseVocabSeq(s string) (vocab, seq int, err error) {
	vs, ss, hasSeq := strings.Cut(s, "x")
	vocab, err1 := strconv.Atoi(vs)
	seq = DefaultSeq
	var err2 error
	if hasSeq {
		seq, err2 = strconv.Atoi(ss)
	}
	if err1 != nil || err2 != nil || vocab < 2 || vocab > maxGPTVocab || seq < 1 || seq > maxGPTSeq {
		return 0, 0, fmt.Errorf("VOCAB or VOCABxSEQ with vocab 2..%d and context 1..%d", maxGPTVocab, maxGPTSeq)
	}
	return vocab, seq, nil
}

// parseCustomGPT parses "LAYERSxHIDDEN:VOCAB[xSEQ]".
func parseCustomGPT(params string) (nn.GPTConfig, error) {
	geom, vs, ok := strings.Cut(params, ":")
	ls, hs, ok2 := strings.Cut(geom, "x")
	layers, err1 := strconv.Atoi(ls)
	hidden, err2 := strconv.Atoi(hs)
	if !ok || !ok2 || err1 != nil || err2 != nil || layers < 1 || layers > maxGPTLayers || hidden < gptHeadDim || hidden > maxGPTHidden || hidden%gptHeadDim != 0 {
		return nn.GPTConfig{}, fmt.Errorf("gpt needs LAYERSxHIDDEN:VOCAB[xSEQ] with 1..%d layers and hidden a multiple of %d up to %d", maxGPTLayers, gptHeadDim, maxGPTHidden)
	}
	vocab, seq, err := parseVocabSeq(vs)
	if err != nil {
		return nn.GPTConfig{}, fmt.Errorf("gpt needs LAYERSxHIDDEN followed by %w", err)
	}
	return checkGPT(nn.GPTConfig{Vocab: vocab, Seq: seq, Hidden: hidden, Heads: hidden / gptHeadDim, Layers: layers, FFN: 4 * hidden, Dropout: 0.1})
}

// checkGPT refuses configurations over the parameter bound.
func checkGPT(cfg nn.GPTConfig) (nn.GPTConfig, error) {
	if n := cfg.NumParams(); n > maxGPTParams {
		return nn.GPTConfig{}, fmt.Errorf("GPT of %.0fM parameters, at most %.0fM", n/1e6, maxGPTParams/1e6)
	}
	if err := cfg.Validate(); err != nil {
		return nn.GPTConfig{}, err
	}
	return cfg, nil
}

// plain adapts the builder of a model without parameters.
func plain(build func(rng *rand.Rand) (*nn.Sequential, error)) func(string, *rand.Rand) (*nn.Sequential, error) {
	return func(_ string, rng *rand.Rand) (*nn.Sequential, error) { return build(rng) }
}

func buildMLP(rng *rand.Rand) (*nn.Sequential, error) {
	return nn.MLP([]int{InputFeatures, 512, 256, Classes}, 0.1, rng), nil
}

func buildMLPSmall(rng *rand.Rand) (*nn.Sequential, error) {
	return nn.MLP([]int{InputFeatures, 128, Classes}, 0, rng), nil
}

func buildBERTTiny(rng *rand.Rand) (*nn.Sequential, error) {
	return nn.ImageBERT(nn.ImageBERTTiny(), rng)
}

// buildDeepMLP parses "WIDTHxDEPTH".
func buildDeepMLP(params string, rng *rand.Rand) (*nn.Sequential, error) {
	ws, ds, ok := strings.Cut(params, "x")
	w, err1 := strconv.Atoi(ws)
	d, err2 := strconv.Atoi(ds)
	if !ok || err1 != nil || err2 != nil || w < 1 || w > maxDeepWidth || d < 1 || d > maxDeepDepth {
		return nil, fmt.Errorf("deep-mlp needs WIDTHxDEPTH with width 1..%d and depth 1..%d", maxDeepWidth, maxDeepDepth)
	}
	sizes := []int{InputFeatures}
	for range d {
		sizes = append(sizes, w)
	}
	sizes = append(sizes, Classes)
	return nn.MLP(sizes, 0, rng), nil
}
