package pipeline

import (
	"fmt"
	"slices"
	"strings"

	"github.com/skyhive/skyhive/alloc"
	"github.com/skyhive/skyhive/models"
	"github.com/skyhive/skyhive/nn"
	"github.com/skyhive/skyhive/optim"
	"github.com/skyhive/skyhive/tensor"
)

// InputFeatures is the per-example input size of the image classifiers a
// pipeline trains: a flattened 28×28 image (models.InputFeatures).
// Language models take ModelInfo.Input instead.
const InputFeatures = models.InputFeatures

// ModelInfo is what the pipeline needs to know of a model spec besides its
// layers: the data one example is.
type ModelInfo struct {
	// Task is the kind of model.
	Task models.Task
	// Input is the per-example input shape: [InputFeatures] for an image
	// classifier, [Seq] token ids for a language model.
	Input []int
	// Labels is the number of labels per example: 1 for an image, Seq
	// next-token ids for a language model.
	Labels int
	// Classes bounds the labels, [0, Classes): the image classes or the
	// vocabulary. A language model's input ids lie in the same range.
	Classes int
	// GPT is a language model's configuration as the pipeline builds it
	// (untied head, see BuildModel).
	GPT nn.GPTConfig
}

// lm reports whether the model is a language model.
func (m ModelInfo) lm() bool { return m.Task == models.LanguageModeling }

// InputLen is the number of input values of one example.
func (m ModelInfo) InputLen() int { return tensor.NumElements(m.Input) }

// DescribeModel returns the ModelInfo of spec without building the model.
func DescribeModel(spec string) (ModelInfo, error) {
	m, err := models.Lookup(spec)
	if err != nil {
		return ModelInfo{}, err
	}
	if m.Task != models.LanguageModeling {
		return ModelInfo{Task: m.Task, Input: []int{InputFeatures}, Labels: 1, Classes: models.Classes}, nil
	}
	cfg, err := models.ParseGPT(spec)
	if err != nil {
		return ModelInfo{}, err
	}
	// The first and last stages live in different processes, which cannot
	// share the token table: the head gets a weight of its own.
	cfg.Untied = true
	return ModelInfo{Task: m.Task, Input: []int{cfg.Seq}, Labels: cfg.Seq, Classes: cfg.Vocab, GPT: cfg}, nil
}

// BuildModel returns the model that a pipeline of spec trains, freshly
// initialised from seed: models.Build for an image classifier, and for a
// language model models.BuildGPT of the spec's configuration with an
// untied head (nn.GPTConfig.Untied), since the token table of stage 0 and
// the output head of the last stage cannot be one tensor across machines.
// Every worker and the coordinator build the same model from the same spec
// and seed.
func BuildModel(spec string, seed uint64) (*nn.Sequential, error) {
	m, _, err := buildModel(spec, seed)
	return m, err
}

// buildModel is BuildModel that also returns the spec's ModelInfo.
func buildModel(spec string, seed uint64) (*nn.Sequential, ModelInfo, error) {
	info, err := DescribeModel(spec)
	if err != nil {
		return nil, ModelInfo{}, err
	}
	var m *nn.Sequential
	if info.lm() {
		m, err = models.BuildGPT(info.GPT, seed)
	} else {
		m, err = models.Build(spec, seed)
	}
	if err != nil {
		return nil, ModelInfo{}, err
	}
	return m, info, nil
}

// checkTokens checks a language model's batch of n sequences before it is
// sent or computed on: inputs x of shape [n, Seq] (unless nil) and labels
// y of shape [n, Seq] (unless nil), every value an integer in
// [0, Vocab): an id past the vocabulary would make the embedding or the
// loss index out of the table.
func (m ModelInfo) checkTokens(x, y *tensor.Tensor, n int) error {
	want := append([]int{n}, m.Input...)
	if x != nil {
		if !slices.Equal(x.Shape, want) || x.Len() != tensor.NumElements(want) {
			return fmt.Errorf("pipeline: token ids \"x\" of shape %v, want %v", x.Shape, want)
		}
		if err := checkIDs("token id", x.Data, m.Classes); err != nil {
			return err
		}
	}
	if y != nil {
		want := []int{n, m.Labels}
		if !slices.Equal(y.Shape, want) || y.Len() != tensor.NumElements(want) {
			return fmt.Errorf("pipeline: labels \"y\" of shape %v, want %v (one next token per input token)", y.Shape, want)
		}
		if err := checkIDs("label", y.Data, m.Classes); err != nil {
			return err
		}
	}
	return nil
}

// checkIDs checks that every value is an integer in [0, n).
func checkIDs(what string, vs []float32, n int) error {
	for i, v := range vs {
		if !(v >= 0 && v < float32(n)) || v != float32(int(v)) {
			return fmt.Errorf("pipeline: %s %v at %d is not an integer in [0, %d)", what, v, i, n)
		}
	}
	return nil
}

// AllocModel turns the layer costs of model for a batch of the given size
// into the allocator's model, with micro micro-batches (1: sequential).
// The examples are images ([batch, InputFeatures]); AllocModelOf takes
// another input shape.
func AllocModel(name string, model *nn.Sequential, batch, micro int) *alloc.Model {
	return AllocModelOf(name, model, []int{InputFeatures}, batch, micro)
}

// AllocModelOf is AllocModel for examples of the given per-example input
// shape (ModelInfo.Input).
func AllocModelOf(name string, model *nn.Sequential, input []int, batch, micro int) *alloc.Model {
	costs := model.LayerCosts(append([]int{batch}, input...))
	layers := make([]alloc.Layer, len(costs))
	lys := model.Layers()
	for i, c := range costs {
		layers[i] = alloc.Layer{
			Name:            fmt.Sprintf("%d.%s", i, lys[i].Name),
			FwdFLOPs:        c.ForwardFLOPs,
			BwdFLOPs:        c.BackwardFLOPs,
			ParamBytes:      4 * c.Params,
			ActivationBytes: c.ActivationBytes,
			OutputBytes:     4 * int64(tensor.NumElements(c.OutShape)),
		}
	}
	return &alloc.Model{Name: name, Layers: layers, Batch: batch, MicroBatches: micro}
}

// OptimConfig selects a stage's optimizer. Every stage builds the same
// optimizer over its own layers.
type OptimConfig struct {
	// Kind is "adamw" (default) or "sgd".
	Kind        string  `json:"kind"`
	LR          float64 `json:"lr"`
	WeightDecay float64 `json:"weight_decay"`
	// Momentum is SGD's momentum.
	Momentum float64 `json:"momentum,omitempty"`
}

// Validate reports an unusable configuration.
func (c OptimConfig) Validate() error {
	switch c.Kind {
	case "", "adamw", "sgd":
	default:
		return fmt.Errorf("pipeline: unknown optimizer %q (want adamw or sgd)", c.Kind)
	}
	if !(c.LR > 0) || c.WeightDecay < 0 || c.Momentum < 0 || c.Momentum >= 1 {
		return fmt.Errorf("pipeline: bad optimizer settings %+v", c)
	}
	return nil
}

// NewOptimizer builds the configured optimizer over params.
func (c OptimConfig) NewOptimizer(params []*nn.Param) optim.Optimizer {
	if c.Kind == "sgd" {
		return optim.NewSGD(params, optim.SGDConfig{LR: c.LR, Momentum: c.Momentum, WeightDecay: c.WeightDecay})
	}
	return optim.NewAdamW(params, optim.AdamWConfig{LR: c.LR, WeightDecay: c.WeightDecay, NoDecay: optim.NoDecayVectors})
}

// Snapshot is the training state of some or all layers: parameter values
// and optimizer buffers by name, and the optimizer's step counter.
type Snapshot struct {
	Params map[string]*tensor.Tensor
	Optim  map[string]*tensor.Tensor
	Step   int64
}

// merge adds the entries of o that s lacks; the step becomes the larger.
func (s *Snapshot) merge(o Snapshot) {
	if s.Params == nil {
		s.Params = map[string]*tensor.Tensor{}
	}
	if s.Optim == nil {
		s.Optim = map[string]*tensor.Tensor{}
	}
	for k, v := range o.Params {
		if _, ok := s.Params[k]; !ok {
			s.Params[k] = v
		}
	}
	for k, v := range o.Optim {
		if _, ok := s.Optim[k]; !ok {
			s.Optim[k] = v
		}
	}
	s.Step = max(s.Step, o.Step)
}

// Checkpoint tensor-name prefixes of parameters and optimizer buffers.
const (
	paramPrefix = "p:"
	optimPrefix = "o:"
)

// tensors flattens the snapshot into prefixed names.
func (s Snapshot) tensors() map[string]*tensor.Tensor {
	out := make(map[string]*tensor.Tensor, len(s.Params)+len(s.Optim))
	for k, v := range s.Params {
		out[paramPrefix+k] = v
	}
	for k, v := range s.Optim {
		out[optimPrefix+k] = v
	}
	return out
}

// snapshotFrom splits prefixed names back into a snapshot.
func snapshotFrom(ts map[string]*tensor.Tensor, step int64) (Snapshot, error) {
	s := Snapshot{Params: map[string]*tensor.Tensor{}, Optim: map[string]*tensor.Tensor{}, Step: step}
	for k, v := range ts {
		switch {
		case strings.HasPrefix(k, paramPrefix):
			s.Params[k[len(paramPrefix):]] = v
		case strings.HasPrefix(k, optimPrefix):
			s.Optim[k[len(optimPrefix):]] = v
		default:
			return Snapshot{}, fmt.Errorf("pipeline: unexpected tensor %q in snapshot", k)
		}
	}
	return s, nil
}

// stageSnapshot picks what the layers with params need out of s.
func (s Snapshot) forParams(params []*nn.Param) (Snapshot, error) {
	out := Snapshot{Params: map[string]*tensor.Tensor{}, Optim: map[string]*tensor.Tensor{}, Step: s.Step}
	for _, p := range params {
		v, ok := s.Params[p.Name]
		if !ok {
			return Snapshot{}, fmt.Errorf("pipeline: no value for parameter %s", p.Name)
		}
		out.Params[p.Name] = v
		prefix := p.Name + "."
		for k, t := range s.Optim {
			if strings.HasPrefix(k, prefix) && !strings.Contains(k[len(prefix):], ".") {
				out.Optim[k] = t
			}
		}
	}
	return out, nil
}
