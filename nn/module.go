// Package nn holds differentiable layers with explicit backward passes.
//
// A Module's Forward returns its output together with a State that holds
// whatever Backward needs. Because the state travels with the call rather than
// living inside the module, one module can have several forward passes in
// flight at once: pipeline schedules with micro-batches (GPipe, 1F1B) and
// expert servers that batch many requests rely on this.
//
// Concurrency: Forward only reads parameters, so several Forward calls may
// run at once. Backward adds into the shared Param.Grad tensors, so Backward
// calls on modules that share parameters must not overlap (run them from
// one goroutine, or guard them). Layers never modify their input or dy;
// a layer may return its input unchanged (Dropout at inference, Reshape
// views), so callers must not modify a layer's output in place unless they
// own the input too.
//
// Gradients accumulate: call ZeroGrad (or an optimizer's ZeroGrad) before
// each step. See cost.go for the FLOP and memory conventions of Cost, and
// gradcheck_test.go for how every layer's Backward is verified.
package nn

import "github.com/skyhive/skyhive/tensor"

// Ctx carries per-call options of a forward pass.
type Ctx struct {
	// Train enables training behaviour (dropout).
	Train bool
	// Mask, if not nil, is a [batch, seq] tensor with 1 for real tokens and 0
	// for padding; attention layers do not attend to padded positions.
	Mask *tensor.Tensor
}

// State is what a Forward call hands to the matching Backward call.
type State any

// Module is a differentiable layer or block of layers.
type Module interface {
	// Forward computes the output for input x.
	Forward(c Ctx, x *tensor.Tensor) (*tensor.Tensor, State)
	// Backward takes the state of one Forward call and the gradient of the
	// loss with respect to that call's output. It adds the parameter
	// gradients into each Param.Grad and returns the gradient with respect
	// to the input.
	Backward(s State, dy *tensor.Tensor) *tensor.Tensor
	// Params lists the trainable parameters with stable, unique names.
	Params() []*Param
	// Cost reports the work and memory of one forward+backward pass on an
	// input of the given shape.
	Cost(in []int) Cost
}

// Param is a named trainable parameter and its accumulated gradient.
type Param struct {
	Name  string
	Value *tensor.Tensor
	Grad  *tensor.Tensor
}

// Cost describes one layer (or block) for a given input shape. The allocator
// in package alloc plans pipelines from these numbers.
type Cost struct {
	// ForwardFLOPs and BackwardFLOPs count floating-point operations (a
	// multiply-add is 2).
	ForwardFLOPs, BackwardFLOPs float64
	// Params is the number of trainable scalars.
	Params int64
	// ActivationBytes is the memory held between forward and backward.
	ActivationBytes int64
	// OutShape is the output shape for the given input shape.
	OutShape []int
}
