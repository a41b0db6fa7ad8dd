package bridge

import (
	"fmt"
	"regexp"
	"slices"

	"github.com/skyhive/skyhive/averaging/peer"
	"github.com/skyhive/skyhive/models"
	"github.com/skyhive/skyhive/nn"
)

// Twin says that a client's model is the PyTorch twin of a registry model
// (python/skyhive/models.py): the same parameters, named, shaped and laid
// out as Skyhive's, in Skyhive's order. Such a client averages with Go
// peers of the same model and data (`skyhive peer --model ...`): the
// daemon gives it their model signature (peer.ModelSignature).
type Twin struct {
	// Model is the registry spec: "mlp", "mlp-small", or a GPT's full
	// spec with its vocabulary and context ("gpt-mini:1024x128").
	Model string `json:"model"`
	// Data is a language model's data signature (train.LMData.Signature:
	// "bpe-HASH" of the tokenizer, or "tokens"); empty for an image model.
	Data string `json:"data,omitempty"`
	// Init asks for the initial weights a Go peer of Seed starts from: the
	// daemon writes them into the shared parameters before it sends shm.
	Init bool   `json:"init,omitempty"`
	Seed uint64 `json:"seed,omitempty"`
}

// twinImages are the image classifiers that have a PyTorch twin.
var twinImages = []string{"mlp", "mlp-small"}

var dataSignature = regexp.MustCompile(`^(bpe-[0-9a-f]{16}|tokens)$`)

// check compares the twin's registry model with the client's parameters
// (already bounded by CheckParams: total elements in all) and returns the
// model signature and the Go model, whose values are the initial weights
// of t.Seed. A GPT's size is checked against total before it is built.
func (t Twin) check(specs []ParamSpec, total int) (string, *nn.Sequential, error) {
	m, err := models.Lookup(t.Model)
	if err != nil {
		return "", nil, fmt.Errorf("twin: %w", err)
	}
	var model *nn.Sequential
	switch {
	case m.Objective == models.CausalLM:
		cfg, err := models.ParseGPT(t.Model)
		if err != nil {
			return "", nil, fmt.Errorf("twin: %w", err)
		}
		if n := cfg.NumParams(); n != float64(total) {
			return "", nil, fmt.Errorf("twin: %s has %.0f parameters, the client's model %d: build the model with skyhive.models.build(%q)", t.Model, n, total, t.Model)
		}
		if !dataSignature.MatchString(t.Data) {
			return "", nil, fmt.Errorf("twin: a language model needs its data's signature (bpe-HASH or tokens, as skyhive tokenize writes it), not %q", t.Data)
		}
		if model, err = models.BuildGPT(cfg, t.Seed); err != nil {
			return "", nil, fmt.Errorf("twin: %w", err)
		}
	case slices.Contains(twinImages, t.Model):
		if t.Data != "" {
			return "", nil, fmt.Errorf("twin: the image classifier %s takes no data signature (got %q)", t.Model, t.Data)
		}
		if model, err = models.Build(t.Model, t.Seed); err != nil {
			return "", nil, fmt.Errorf("twin: %w", err)
		}
	default:
		return "", nil, fmt.Errorf("twin: %s has no PyTorch twin (those of %v and the GPTs have)", t.Model, twinImages)
	}
	ps := model.Params()
	if len(ps) != len(specs) {
		return "", nil, fmt.Errorf("twin: %s has %d parameter tensors, the client's model %d", t.Model, len(ps), len(specs))
	}
	for i, p := range ps {
		if p.Name != specs[i].Name || !slices.Equal(p.Value.Shape, specs[i].Shape) {
			return "", nil, fmt.Errorf("twin: parameter %d is %s %v in the client's model, %s %v in Skyhive's %s", i, specs[i].Name, specs[i].Shape, p.Name, p.Value.Shape, t.Model)
		}
	}
	return peer.ModelSignature(t.Model, nn.NumParams(ps), t.Data), model, nil
}
