// Package tensor provides dense float32 tensors, GEMM (OpenBLAS when it is
// installed, a blocked parallel pure-Go kernel otherwise) and the element-wise
// kernels that the layers in package nn are built from.
//
// Kernels operate on []float32 slices so hot loops never go through
// interfaces; Tensor adds a shape on top of a slice.
package tensor

import (
	"fmt"
	"strings"
)

// Tensor is a dense, row-major float32 array.
type Tensor struct {
	Shape []int
	Data  []float32
}

// New returns a zero tensor of the given shape.
func New(shape ...int) *Tensor {
	n := NumElements(shape)
	return &Tensor{Shape: append([]int(nil), shape...), Data: make([]float32, n)}
}

// FromSlice wraps data (not copied) in a tensor of the given shape.
// It panics if len(data) does not match the shape: that is a programming error.
func FromSlice(data []float32, shape ...int) *Tensor {
	if n := NumElements(shape); n != len(data) {
		panic(fmt.Sprintf("tensor: %d elements do not fit shape %v", len(data), shape))
	}
	return &Tensor{Shape: append([]int(nil), shape...), Data: data}
}

// NumElements is the product of the dimensions in shape.
func NumElements(shape []int) int {
	n := 1
	for _, d := range shape {
		if d < 0 {
			panic(fmt.Sprintf("tensor: negative dimension in %v", shape))
		}
		n *= d
	}
	return n
}

// Len returns the number of elements.
func (t *Tensor) Len() int { return len(t.Data) }

// Dim returns dimension i; negative i counts from the end.
func (t *Tensor) Dim(i int) int {
	if i < 0 {
		i += len(t.Shape)
	}
	return t.Shape[i]
}

// Clone returns a deep copy.
func (t *Tensor) Clone() *Tensor {
	return &Tensor{Shape: append([]int(nil), t.Shape...), Data: append([]float32(nil), t.Data...)}
}

// Reshape returns a tensor sharing t's data with a new shape.
func (t *Tensor) Reshape(shape ...int) *Tensor {
	return FromSlice(t.Data, shape...)
}

// Zero sets every element to 0.
func (t *Tensor) Zero() { clear(t.Data) }

// SameShape reports whether a and b have identical shapes.
func SameShape(a, b []int) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// String prints the shape and up to 8 leading values.
func (t *Tensor) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "Tensor%v[", t.Shape)
	for i, v := range t.Data {
		if i == 8 {
			b.WriteString(" ...")
			break
		}
		if i > 0 {
			b.WriteByte(' ')
		}
		fmt.Fprintf(&b, "%.4g", v)
	}
	b.WriteByte(']')
	return b.String()
}
