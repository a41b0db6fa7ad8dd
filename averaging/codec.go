package averaging

import (
	"encoding/binary"
	"fmt"
	"math"
	"slices"
	"sync"
	"unsafe"

	"github.com/skyhive/skyhive/tensor"
	"github.com/skyhive/skyhive/wire"
)

// The chunks of an all-reduce travel as wire tensor encodings (a
// one-dimensional float32 tensor, docs/p2p.md). For the lossless and fp16
// codecs this file writes and reads that format directly, straight into the
// message buffer and out of it into the destination slice, so a chunk costs
// one pass each way instead of the general encoder's staging copies and
// the decoder's growing buffers. The 8-bit codecs go through package wire.

// wire tensor header of a vector: "SKT", version 1, dtype float32, codec,
// ndim 1, reserved 0, then the length as uint32 little-endian.
const vecHeader = 8 + 4

// encodedLen is the encoded size of n elements.
func encodedLen(n int, codec wire.Codec) int {
	switch codec {
	case wire.CodecNone:
		return vecHeader + 4*n
	case wire.CodecFP16:
		return vecHeader + 2*n
	}
	return vecHeader + n + 8*(n/64+1) + 1024 // 8-bit codecs: a capacity hint
}

// appendVector appends x's wire encoding with codec to b.
func appendVector(b []byte, x []float32, codec wire.Codec) ([]byte, error) {
	switch codec {
	case wire.CodecNone, wire.CodecFP16:
		b = append(b, 'S', 'K', 'T', 1, 1, byte(codec), 1, 0)
		b = binary.LittleEndian.AppendUint32(b, uint32(len(x)))
		o := len(b)
		if codec == wire.CodecNone {
			b = slices.Grow(b, 4*len(x))[:o+4*len(x)]
			if nativeLE {
				copy(b[o:], f32Bytes(x))
			} else {
				for i, v := range x {
					binary.LittleEndian.PutUint32(b[o+4*i:], math.Float32bits(v))
				}
			}
		} else {
			b = slices.Grow(b, 2*len(x))[:o+2*len(x)]
			p := b[o:]
			for i, v := range x {
				binary.LittleEndian.PutUint16(p[2*i:], wire.Float32ToHalf(v))
			}
		}
		return b, nil
	}
	enc, err := wire.Marshal(tensor.FromSlice(x, len(x)), wire.Options{Codec: codec})
	if err != nil {
		return nil, err
	}
	return append(b, enc...), nil
}

// decodeInto decodes a wire tensor of exactly len(dst) finite elements
// into dst and returns their sum of squares, summed in float64 (as Norm
// does). One pass both checks finiteness and gives the norm: a finite
// float32 squared cannot overflow a float64 sum, so the sum is finite
// exactly when every element is. On error dst may hold part of the data.
func decodeInto(b []byte, dst []float32) (float64, error) {
	want := len(dst)
	if len(b) >= vecHeader && string(b[:5]) == "SKT\x01\x01" && b[6] == 1 && b[7] == 0 &&
		(wire.Codec(b[5]) == wire.CodecNone || wire.Codec(b[5]) == wire.CodecFP16) {
		if n := binary.LittleEndian.Uint32(b[8:]); uint64(n) != uint64(want) {
			return 0, fmt.Errorf("%w: chunk of %d elements, want %d", ErrMessage, n, want)
		}
		p := b[vecHeader:]
		if wire.Codec(b[5]) == wire.CodecNone {
			if len(p) != 4*want {
				return 0, fmt.Errorf("%w: chunk of %d bytes for %d float32", ErrMessage, len(p), want)
			}
			if nativeLE {
				copy(f32Bytes(dst), p)
			} else {
				for i := range dst {
					dst[i] = math.Float32frombits(binary.LittleEndian.Uint32(p[4*i:]))
				}
			}
		} else {
			if len(p) != 2*want {
				return 0, fmt.Errorf("%w: chunk of %d bytes for %d halves", ErrMessage, len(p), want)
			}
			for i := range dst {
				dst[i] = wire.HalfToFloat32(binary.LittleEndian.Uint16(p[2*i:]))
			}
		}
		ss := tensor.SumSquares(dst)
		if math.IsNaN(ss) || math.IsInf(ss, 0) {
			return 0, fmt.Errorf("%w: non-finite value in chunk", ErrMessage)
		}
		return ss, nil
	}
	x, err := decodeVector(b, want)
	if err != nil {
		return 0, err
	}
	copy(dst, x)
	return tensor.SumSquares(dst), nil
}

// nativeLE is a constant property of the machine.
var nativeLE = binary.NativeEndian.Uint16([]byte{1, 0}) == 1

// f32Bytes views a float32 slice as its bytes in machine order.
func f32Bytes(x []float32) []byte {
	if len(x) == 0 {
		return nil
	}
	return unsafe.Slice((*byte)(unsafe.Pointer(&x[0])), 4*len(x))
}

// scratch recycles chunk-sized float32 buffers for decoding contributions.
var scratch sync.Pool

func getScratch(n int) *[]float32 {
	if p, ok := scratch.Get().(*[]float32); ok && cap(*p) >= n {
		*p = (*p)[:n]
		return p
	}
	s := make([]float32, n)
	return &s
}

func putScratch(p *[]float32) { scratch.Put(p) }
