// Package models is the model registry: the named Fashion-MNIST classifiers
// that every training mode (local, pipeline, group averaging) and the
// profiler build. A spec is a plain name ("mlp") or a name with parameters
// ("deep-mlp:512x16"); the same spec and seed give the same weights in every
// process, which is how peers and pipeline workers agree on a model without
// sending it.
package models

import (
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"

	"github.com/skyhive/skyhive/data"
	"github.com/skyhive/skyhive/nn"
)

// InputFeatures is the per-example input size of every registry model: a
// flattened 28×28 image. Every model maps [batch, InputFeatures] inputs to
// [batch, Classes] logits.
const InputFeatures = data.ImageSize

// Classes is the number of logits every registry model outputs.
const Classes = data.NumClasses

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
}

// entry is a registry row: its description and its builder, which gets the
// text after the ':' of the spec ("" for plain names) and the seeded
// generator that all of a model's initialisation draws from.
type entry struct {
	Model
	build func(params string, rng *rand.Rand) (*nn.Sequential, error)
}

// registry is the fixed table of models, in the order List gives them.
var registry = [...]entry{
	{Model{"mlp", "mlp", "784-512-256-10 MLP with dropout 0.1 (536k parameters)"}, plain(buildMLP)},
	{Model{"mlp-small", "mlp-small", "784-128-10 MLP without dropout (102k parameters), light for swarms of many peers"}, plain(buildMLPSmall)},
	{Model{"bert-tiny", "bert-tiny", "BERT-style classifier of 7×7 patches: hidden 64, 4 heads, 2 layers (72k parameters)"}, plain(buildBERTTiny)},
	{Model{"deep-mlp", "deep-mlp:WIDTHxDEPTH", fmt.Sprintf("DEPTH equal hidden layers (Linear+ReLU) of WIDTH units, no dropout; width ≤ %d, depth ≤ %d", maxDeepWidth, maxDeepDepth)}, buildDeepMLP},
}

// List returns the registry's models in a fixed order.
func List() []Model {
	out := make([]Model, len(registry))
	for i, e := range registry {
		out[i] = e.Model
	}
	return out
}

// Usage lists the valid specs for help texts and error messages:
// "mlp, mlp-small, bert-tiny or deep-mlp:WIDTHxDEPTH".
func Usage() string {
	us := make([]string, len(registry))
	for i, e := range registry {
		us[i] = e.Usage
	}
	return strings.Join(us[:len(us)-1], ", ") + " or " + us[len(us)-1]
}

// Help returns one line per model, its usage and what it is, each line
// starting with indent.
func Help(indent string) string {
	width := 0
	for _, e := range registry {
		width = max(width, len(e.Usage))
	}
	var b strings.Builder
	for _, e := range registry {
		fmt.Fprintf(&b, "%s%-*s  %s\n", indent, width, e.Usage, e.Help)
	}
	return b.String()
}

// Build returns a freshly initialised model for spec (see List), its
// weights drawn from a PCG generator seeded with seed: the same spec and
// seed give the same weights in every process.
func Build(spec string, seed uint64) (*nn.Sequential, error) {
	name, params, hasParams := strings.Cut(spec, ":")
	for _, e := range registry {
		if e.Name != name || hasParams != strings.Contains(e.Usage, ":") {
			continue
		}
		m, err := e.build(params, rand.New(rand.NewPCG(seed, 0x5eed)))
		if err != nil {
			return nil, fmt.Errorf("models: bad model spec %q: %w (want %s)", spec, err, Usage())
		}
		return m, nil
	}
	return nil, fmt.Errorf("models: unknown model %q (want %s)", spec, Usage())
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
