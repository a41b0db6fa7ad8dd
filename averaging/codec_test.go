package averaging

import (
	"math"
	"slices"
	"testing"

	"github.com/skyhive/skyhive/tensor"
	"github.com/skyhive/skyhive/wire"
)

// The direct chunk codec must agree with package wire.
func TestAppendVectorMatchesWire(t *testing.T) {
	x := []float32{0, 1.5, -2.25, 3e-8, 65504, 1e10, -0}
	for _, c := range []wire.Codec{wire.CodecNone, wire.CodecFP16, wire.CodecUniform8, wire.CodecQuantile8} {
		got, err := appendVector([]byte("pre"), x, c)
		if err != nil {
			t.Fatal(err)
		}
		want, err := wire.Marshal(tensor.FromSlice(x, len(x)), wire.Options{Codec: c})
		if err != nil {
			t.Fatal(err)
		}
		if string(got[:3]) != "pre" || !slices.Equal(got[3:], want) {
			t.Fatalf("%v: encoding differs from wire.Marshal", c)
		}
	}
}

func FuzzDecodeInto(f *testing.F) {
	for _, c := range []wire.Codec{wire.CodecNone, wire.CodecFP16, wire.CodecUniform8} {
		b, _ := wire.Marshal(tensor.FromSlice([]float32{1, -2, 3}, 3), wire.Options{Codec: c})
		f.Add(b, 3)
	}
	f.Fuzz(func(t *testing.T, b []byte, n int) {
		if n < 0 || n > 1<<16 {
			return
		}
		dst := make([]float32, n)
		ss, err := decodeInto(b, dst)
		ref, rerr := decodeVector(b, n)
		if (err == nil) != (rerr == nil) {
			t.Fatalf("decodeInto err %v, decodeVector err %v", err, rerr)
		}
		if err != nil {
			return
		}
		for i, v := range dst {
			if math.Float32bits(v) != math.Float32bits(ref[i]) {
				t.Fatalf("element %d: %v vs %v", i, v, ref[i])
			}
		}
		if want := tensor.SumSquares(ref); ss != want {
			t.Fatalf("sum of squares %v, want %v", ss, want)
		}
	})
}
