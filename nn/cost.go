package nn

import (
	"fmt"
	"slices"
)

// Cost conventions used by every layer in this package:
//
//   - A multiply-add is 2 FLOPs, so an m×k by k×n GEMM is 2·m·n·k FLOPs.
//   - The backward pass of a GEMM-based layer computes two GEMMs of the same
//     size as the forward one (input gradient and weight gradient), so its
//     BackwardFLOPs are 2× ForwardFLOPs. For an input layer that needs no
//     input gradient (Embedding) only the weight gradient is counted.
//   - Element-wise work is counted with a small constant per element (e.g. 1
//     for ReLU, about 8 for LayerNorm forward); these terms are small next to
//     the GEMMs and only need to be of the right order.
//   - ActivationBytes is what the State of one Forward call keeps alive until
//     Backward (float32 = 4 bytes), excluding parameters and the input that
//     the caller owns anyway unless the layer stores it.

const f32 = 4 // bytes per float32

// rowsOf splits a shape into the product of its leading dimensions and its
// last dimension.
func rowsOf(shape []int) (rows, last int) {
	if len(shape) == 0 {
		return 1, 1
	}
	rows = 1
	for _, d := range shape[:len(shape)-1] {
		rows *= d
	}
	return rows, shape[len(shape)-1]
}

// numel is the product of shape.
func numel(shape []int) int {
	n := 1
	for _, d := range shape {
		n *= d
	}
	return n
}

// withLast returns a copy of shape with its last dimension replaced by d.
func withLast(shape []int, d int) []int {
	out := slices.Clone(shape)
	out[len(out)-1] = d
	return out
}

// checkLast panics if the last dimension of shape is not want; a mismatch is
// a programming error in how the model was wired.
func checkLast(layer string, shape []int, want int) {
	if len(shape) == 0 || shape[len(shape)-1] != want {
		panic(fmt.Sprintf("nn: %s expects last dimension %d, got shape %v", layer, want, shape))
	}
}

// Add returns the sum of two costs as if the layers ran one after the other;
// OutShape is taken from b.
func (a Cost) Add(b Cost) Cost {
	return Cost{
		ForwardFLOPs:    a.ForwardFLOPs + b.ForwardFLOPs,
		BackwardFLOPs:   a.BackwardFLOPs + b.BackwardFLOPs,
		Params:          a.Params + b.Params,
		ActivationBytes: a.ActivationBytes + b.ActivationBytes,
		OutShape:        b.OutShape,
	}
}

// TotalFLOPs is ForwardFLOPs + BackwardFLOPs.
func (a Cost) TotalFLOPs() float64 { return a.ForwardFLOPs + a.BackwardFLOPs }
