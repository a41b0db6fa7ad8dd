package pipeline

import (
	"fmt"
	"strings"

	"github.com/skyhive/skyhive/alloc"
	"github.com/skyhive/skyhive/models"
	"github.com/skyhive/skyhive/nn"
	"github.com/skyhive/skyhive/optim"
	"github.com/skyhive/skyhive/tensor"
)

// InputFeatures is the per-example input size of every model a pipeline
// trains: a flattened 28×28 image (models.InputFeatures).
const InputFeatures = models.InputFeatures

// BuildModel is models.Build, kept as a forwarder for the CLI's pipeline
// commands; new code calls models.Build.
func BuildModel(spec string, seed uint64) (*nn.Sequential, error) { return models.Build(spec, seed) }

// AllocModel turns the layer costs of model for a batch of the given size
// into the allocator's model, with micro micro-batches (1: sequential).
func AllocModel(name string, model *nn.Sequential, batch, micro int) *alloc.Model {
	costs := model.LayerCosts([]int{batch, InputFeatures})
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
