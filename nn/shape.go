package nn

import (
	"fmt"
	"slices"

	"github.com/skyhive/skyhive/tensor"
)

// Reshape changes the shape of every sample without moving data: an input
// [batch, …] becomes [batch, Shape…]. Flatten is Reshape to one dimension.
type Reshape struct{ Shape []int }

// Flatten returns a Reshape that turns [batch, …] into [batch, n].
func Flatten(n int) Reshape { return Reshape{Shape: []int{n}} }

func (r Reshape) out(in []int) []int {
	if len(in) == 0 || numel(in[1:]) != numel(r.Shape) {
		panic(fmt.Sprintf("nn: cannot reshape %v to [batch %v]", in, r.Shape))
	}
	return append([]int{in[0]}, r.Shape...)
}

// Forward returns x viewed with the new shape (sharing its data).
func (r Reshape) Forward(_ Ctx, x *tensor.Tensor) (*tensor.Tensor, State) {
	return x.Reshape(r.out(x.Shape)...), slices.Clone(x.Shape)
}

// Backward returns dy viewed with the input shape.
func (r Reshape) Backward(s State, dy *tensor.Tensor) *tensor.Tensor {
	return dy.Reshape(s.([]int)...)
}

// Params returns nil.
func (Reshape) Params() []*Param { return nil }

// Cost is free.
func (r Reshape) Cost(in []int) Cost { return Cost{OutShape: r.out(in)} }

// Patchify cuts square images [batch, Size·Size] (or [batch, Size, Size])
// into non-overlapping Patch×Patch tiles, giving a token sequence
// [batch, (Size/Patch)², Patch²] in row-major tile order, each tile's pixels
// in row-major order. It is the first step of a vision transformer.
type Patchify struct{ Size, Patch int }

func (p Patchify) dims(in []int) (batch, tiles, pix int) {
	if p.Patch <= 0 || p.Size%p.Patch != 0 || len(in) == 0 || numel(in[1:]) != p.Size*p.Size {
		panic(fmt.Sprintf("nn: Patchify{%d,%d} cannot take shape %v", p.Size, p.Patch, in))
	}
	g := p.Size / p.Patch
	return in[0], g * g, p.Patch * p.Patch
}

// permute copies between image and tile layouts; toTiles selects direction.
func (p Patchify) permute(img, tiles []float32, batch int, toTiles bool) {
	g, ps, sz := p.Size/p.Patch, p.Patch, p.Size
	for b := 0; b < batch; b++ {
		im := img[b*sz*sz : (b+1)*sz*sz]
		tl := tiles[b*sz*sz : (b+1)*sz*sz]
		for ty := 0; ty < g; ty++ {
			for tx := 0; tx < g; tx++ {
				t := (ty*g + tx) * ps * ps
				for y := 0; y < ps; y++ {
					src := im[(ty*ps+y)*sz+tx*ps : (ty*ps+y)*sz+tx*ps+ps]
					dst := tl[t+y*ps : t+y*ps+ps]
					if toTiles {
						copy(dst, src)
					} else {
						copy(src, dst)
					}
				}
			}
		}
	}
}

// Forward returns the tiles.
func (p Patchify) Forward(_ Ctx, x *tensor.Tensor) (*tensor.Tensor, State) {
	b, t, n := p.dims(x.Shape)
	y := tensor.New(b, t, n)
	p.permute(x.Data, y.Data, b, true)
	return y, slices.Clone(x.Shape)
}

// Backward scatters dy back to image layout.
func (p Patchify) Backward(s State, dy *tensor.Tensor) *tensor.Tensor {
	shape := s.([]int)
	dx := tensor.New(shape...)
	p.permute(dx.Data, dy.Data, shape[0], false)
	return dx
}

// Params returns nil.
func (Patchify) Params() []*Param { return nil }

// Cost counts one copy per element each way.
func (p Patchify) Cost(in []int) Cost {
	b, t, n := p.dims(in)
	e := float64(b * t * n)
	return Cost{ForwardFLOPs: e, BackwardFLOPs: e, OutShape: []int{b, t, n}}
}

// MeanPool averages [batch, seq, hidden] over the sequence, giving
// [batch, hidden]. With Ctx.Mask set it averages only real tokens (a
// sequence with no real token pools to zero).
type MeanPool struct{}

type meanPoolState struct {
	shape  []int
	weight []float32 // per (batch, seq) weight: mask/count or 1/seq
}

// Forward averages over the sequence dimension.
func (MeanPool) Forward(c Ctx, x *tensor.Tensor) (*tensor.Tensor, State) {
	if len(x.Shape) != 3 {
		panic(fmt.Sprintf("nn: MeanPool expects [batch, seq, hidden], got %v", x.Shape))
	}
	b, s, h := x.Shape[0], x.Shape[1], x.Shape[2]
	mask := maskData(c, b, s)
	w := make([]float32, b*s)
	y := tensor.New(b, h)
	for bi := 0; bi < b; bi++ {
		var cnt float32
		for si := 0; si < s; si++ {
			if mask == nil || mask[bi*s+si] != 0 {
				cnt++
			}
		}
		for si := 0; si < s; si++ {
			if cnt > 0 && (mask == nil || mask[bi*s+si] != 0) {
				w[bi*s+si] = 1 / cnt
				tensor.Axpy(1/cnt, x.Data[(bi*s+si)*h:(bi*s+si+1)*h], y.Data[bi*h:(bi+1)*h])
			}
		}
	}
	return y, meanPoolState{shape: slices.Clone(x.Shape), weight: w}
}

// Backward spreads dy over the pooled positions.
func (MeanPool) Backward(st State, dy *tensor.Tensor) *tensor.Tensor {
	ms := st.(meanPoolState)
	b, s, h := ms.shape[0], ms.shape[1], ms.shape[2]
	dx := tensor.New(ms.shape...)
	for bi := 0; bi < b; bi++ {
		for si := 0; si < s; si++ {
			if w := ms.weight[bi*s+si]; w != 0 {
				tensor.Axpy(w, dy.Data[bi*h:(bi+1)*h], dx.Data[(bi*s+si)*h:(bi*s+si+1)*h])
			}
		}
	}
	return dx
}

// Params returns nil.
func (MeanPool) Params() []*Param { return nil }

// Cost counts one multiply-add per input element each way.
func (MeanPool) Cost(in []int) Cost {
	if len(in) != 3 {
		panic(fmt.Sprintf("nn: MeanPool expects [batch, seq, hidden], got %v", in))
	}
	n := float64(numel(in))
	return Cost{ForwardFLOPs: 2 * n, BackwardFLOPs: 2 * n, ActivationBytes: int64(in[0]*in[1]) * f32, OutShape: []int{in[0], in[2]}}
}
