// What the server checks before a request touches an expert: the shape of
// every tensor in every dimension, the magnitude of every value, and the
// memory the request would need; and what it checks before weights leave
// the process: that they are finite.

package server

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/skyhive/skyhive/moe"
	"github.com/skyhive/skyhive/tensor"
	"github.com/skyhive/skyhive/wire"
)

// Defaults of the Config fields that bound what one request may do.
const (
	// DefaultClipNorm is the default Config.ClipNorm: far above the
	// gradient norms of honest backward batches (see
	// TestDefaultClipLeavesHonestTrainingAlone), so it only limits what a
	// single step can do to an expert.
	DefaultClipNorm = 100
	// DefaultMaxSeqLen is the default Config.MaxSeqLen.
	DefaultMaxSeqLen = 1024
	// DefaultMaxAbsValue is the default Config.MaxAbsValue. With inputs
	// and output gradients below it, the sums of a backward pass (a bias
	// gradient sums a batch of output gradients, a GEMM sums products over
	// rows) stay many orders of magnitude below float32's 3.4e38.
	DefaultMaxAbsValue = 1e8
	// DefaultBlockFor is the default Config.BlockFor.
	DefaultBlockFor = 10 * time.Minute
	// DefaultRequestMemory is the smallest default Config.RequestMemory.
	DefaultRequestMemory = 1 << 30
	// DefaultQueueMemory is the default Config.QueueMemory.
	DefaultQueueMemory = 2 << 30
)

// errNonFiniteOutput reports an expert whose answer held NaN or Inf.
var errNonFiniteOutput = errors.New("expert produced non-finite values")

// errPoisoned marks requests no honest trainer sends: non-finite or absurd
// values. Their sender is blocked (Config.BlockFor).
var errPoisoned = errors.New("poisoned request")

// inputDims is the rank of the experts' inputs.
func (c *Config) inputDims() int {
	if c.Type == TypeTransformer {
		return 3
	}
	return 2
}

// maxInputElements is the size of the largest input a request may carry.
func (c *Config) maxInputElements() int64 {
	n := int64(c.MaxBatch) * int64(c.Hidden)
	if c.Type == TypeTransformer {
		n *= int64(c.MaxSeqLen)
	}
	return n
}

// requestLimits tightens the wire limits to what a valid request of this
// server can hold (x and dy of the experts' rank and largest size), so
// decoding never allocates more than the largest acceptable request.
func (c *Config) requestLimits() wire.Limits {
	l := c.Limits
	l.MaxDims = min(l.MaxDims, c.inputDims())
	l.MaxTensors = min(l.MaxTensors, 2)
	if n := 2 * c.maxInputElements(); n < int64(l.MaxElements) {
		l.MaxElements = int(n)
	}
	return l
}

// workBytes estimates the memory an expert needs to run a forward or a
// backward pass on an input of the given (validated) shape: its
// activations, their gradients, the attention weights of transformer
// experts (batch·heads·seq² per pass, twice in backward) and copies of the
// input and output. It is linear in the batch size, so the estimate of a
// batch is the sum of its requests'. It is computed in float64 and
// saturates, so no shape can make it wrap around.
func (c *Config) workBytes(shape []int, backward bool) int64 {
	h := float64(c.Hidden)
	var floats float64
	switch c.Type {
	case TypeTransformer:
		b, s := float64(shape[0]), float64(shape[1])
		perToken, attn := 24.0, 1.0
		if backward {
			perToken, attn = 50, 2
		}
		floats = b*s*h*perToken + b*float64(c.Heads)*s*s*attn
	default:
		perRow := 14.0
		if backward {
			perRow = 30
		}
		floats = float64(shape[0]) * h * perRow
	}
	bytes := 4 * floats
	if bytes >= math.MaxInt64 {
		return math.MaxInt64
	}
	return int64(bytes)
}

// checkShape checks a request tensor's shape against the expert's real
// input: its rank and every dimension (batch up to MaxBatch, sequence
// length up to MaxSeqLen, hidden size equal to the expert's).
func (c *Config) checkShape(spec moe.Spec, shape []int) error {
	want := "[batch, hidden]"
	if spec.InputDims == 3 {
		want = "[batch, seq, hidden]"
	}
	if len(shape) != spec.InputDims || shape[len(shape)-1] != spec.Hidden {
		return fmt.Errorf("shape %v, expert %s wants %s with hidden %d", shape, spec.UID, want, spec.Hidden)
	}
	if shape[0] < 1 || shape[0] > c.MaxBatch {
		return fmt.Errorf("%d rows, not in [1, %d] (the server's max batch)", shape[0], c.MaxBatch)
	}
	if spec.InputDims == 3 && (shape[1] < 1 || shape[1] > c.MaxSeqLen) {
		return fmt.Errorf("sequence length %d, not in [1, %d]", shape[1], c.MaxSeqLen)
	}
	return nil
}

// checkTensor checks a decoded request tensor: its shape (checkShape, also
// applied while decoding) and every value (finite and at most MaxAbsValue
// in magnitude).
func (c *Config) checkTensor(spec moe.Spec, x *tensor.Tensor, name string) error {
	if x == nil {
		return fmt.Errorf("missing tensor %q", name)
	}
	if err := c.checkShape(spec, x.Shape); err != nil {
		return fmt.Errorf("tensor %q: %w", name, err)
	}
	n := 1
	for _, d := range x.Shape { // each dimension is bounded above
		n *= d
	}
	if n != len(x.Data) {
		return fmt.Errorf("tensor %q has %d values for shape %v", name, len(x.Data), x.Shape)
	}
	// In float32, one branch per value: a NaN fails both comparisons, an
	// Inf the bound (at most MaxFloat32).
	lim := float32(min(c.MaxAbsValue, math.MaxFloat32))
	for _, v := range x.Data {
		if !(v <= lim && v >= -lim) {
			return fmt.Errorf("%w: tensor %q holds %g: values must be finite and at most %g in magnitude", errPoisoned, name, v, c.MaxAbsValue)
		}
	}
	return nil
}

// checkRequest validates a forward (dy == nil) or backward request for e
// and returns the working memory it needs, refusing requests that need
// more than Config.RequestMemory.
func (c *Config) checkRequest(e *expert, x, dy *tensor.Tensor, backward bool) (int64, error) {
	if err := c.checkTensor(e.spec, x, "x"); err != nil {
		return 0, err
	}
	if backward {
		if err := c.checkTensor(e.spec, dy, "dy"); err != nil {
			return 0, err
		}
		if !slices.Equal(x.Shape, dy.Shape) {
			return 0, fmt.Errorf("x %v and dy %v differ in shape", x.Shape, dy.Shape)
		}
	}
	if err := c.checkWork(x.Shape, backward); err != nil {
		return 0, err
	}
	return c.workBytes(x.Shape, backward), nil
}

// checkWork refuses an input shape (already checked by checkShape) whose
// forward or backward pass needs more than RequestMemory.
func (c *Config) checkWork(shape []int, backward bool) error {
	if work := c.workBytes(shape, backward); work > c.RequestMemory {
		return fmt.Errorf("input %v needs about %d MiB of working memory, over the per-request budget of %d MiB", shape, work>>20, c.RequestMemory>>20)
	}
	return nil
}

// allFinite reports whether every value of data is finite.
func allFinite(data []float32) bool {
	for _, v := range data {
		if v-v != 0 { // NaN - NaN and Inf - Inf are NaN
			return false
		}
	}
	return true
}

// tensorsFinite reports whether every tensor of m is finite.
func tensorsFinite(m map[string]*tensor.Tensor) bool {
	for _, t := range m {
		if !allFinite(t.Data) {
			return false
		}
	}
	return true
}
