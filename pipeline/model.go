package pipeline

import (
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"

	"github.com/skyhive/skyhive/alloc"
	"github.com/skyhive/skyhive/data"
	"github.com/skyhive/skyhive/nn"
	"github.com/skyhive/skyhive/optim"
	"github.com/skyhive/skyhive/tensor"
	"github.com/skyhive/skyhive/train"
)

// InputFeatures is the per-example input size of every model BuildModel
// offers: a flattened 28×28 image.
const InputFeatures = data.ImageSize

// Model size bounds for "deep-mlp" specs, so a peer cannot make a worker
// build an absurd model.
const (
	maxDeepWidth = 8192
	maxDeepDepth = 256
)

// BuildModel returns a freshly initialised classifier on [batch, 784] inputs
// with 10 logits. spec is a name of train.Models ("mlp", "bert-tiny") or
// "deep-mlp:WIDTHxDEPTH", an MLP of DEPTH hidden Linear+ReLU layers of
// WIDTH units without dropout (e.g. "deep-mlp:512x16"), whose many equal
// layers make pipeline partitions easy to compare. The same spec and seed
// give the same weights in every process.
func BuildModel(spec string, seed uint64) (*nn.Sequential, error) {
	rest, ok := strings.CutPrefix(spec, "deep-mlp:")
	if !ok {
		m, err := train.BuildModel(spec, seed)
		if err != nil {
			return nil, fmt.Errorf("pipeline: %w (or deep-mlp:WIDTHxDEPTH)", err)
		}
		return m, nil
	}
	ws, ds, ok := strings.Cut(rest, "x")
	w, err1 := strconv.Atoi(ws)
	d, err2 := strconv.Atoi(ds)
	if !ok || err1 != nil || err2 != nil || w < 1 || w > maxDeepWidth || d < 1 || d > maxDeepDepth {
		return nil, fmt.Errorf("pipeline: bad model spec %q (want deep-mlp:WIDTHxDEPTH, width ≤ %d, depth ≤ %d)", spec, maxDeepWidth, maxDeepDepth)
	}
	sizes := []int{InputFeatures}
	for range d {
		sizes = append(sizes, w)
	}
	sizes = append(sizes, data.NumClasses)
	rng := rand.New(rand.NewPCG(seed, 0x5eed))
	return nn.MLP(sizes, 0, rng), nil
}

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
