package wire

import (
	"sort"

	"bytes"
	"encoding/binary"
	"math"
	"runtime"
	"testing"

	"github.com/skyhive/skyhive/tensor"
)

// fuzzLimits keep fuzzed decodes small so the allocation check is sharp.
var fuzzLimits = Limits{MaxElements: 1 << 14, MaxDims: 6, MaxTensors: 8}

func seedTensors(f *testing.F) {
	x := tensor.FromSlice([]float32{1, -2, 3.5, 0, 1e-3, 7}, 2, 3)
	for c := CodecNone; c <= CodecQuantile8; c++ {
		b, _ := Marshal(x, Options{Codec: c, ChunkSize: 4})
		f.Add(b)
		f.Add(b[:len(b)/2])
	}
	f.Add([]byte{'S', 'K', 'T', 1, 1, 0, 1, 0, 0xff, 0xff, 0xff, 0xff})
	f.Add([]byte{})
}

// FuzzUnmarshal feeds arbitrary bytes to the tensor decoder: it must never
// panic, never allocate far beyond the limit, and anything it accepts must
// re-encode to the same bytes when the codec is lossless.
func FuzzUnmarshal(f *testing.F) {
	seedTensors(f)
	f.Fuzz(func(t *testing.T, b []byte) {
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		x, err := Unmarshal(b, fuzzLimits)
		runtime.ReadMemStats(&after)
		// Limit of 16384 float32 plus scratch buffers and the shape.
		if got := after.TotalAlloc - before.TotalAlloc; got > 1<<20 {
			t.Fatalf("allocated %d bytes decoding %d bytes", got, len(b))
		}
		if err != nil {
			return
		}
		if len(x.Data) != tensor.NumElements(x.Shape) || len(x.Data) > fuzzLimits.MaxElements {
			t.Fatalf("decoded inconsistent tensor %v with %d elements", x.Shape, len(x.Data))
		}
		codec := Codec(b[5])
		if codec == CodecNone || codec == CodecFP16 {
			again, err := Marshal(x, Options{Codec: codec})
			if err != nil {
				t.Fatalf("re-encode: %v", err)
			}
			if codec == CodecNone && !bytes.Equal(again, b) {
				t.Fatalf("re-encoding differs")
			}
		}
	})
}

// FuzzUnmarshalMessage does the same for messages of named tensors.
func FuzzUnmarshalMessage(f *testing.F) {
	x := tensor.FromSlice([]float32{1, 2, 3}, 3)
	b, _ := MarshalMessage([]Named{{"a", x}, {"bb", x}}, Options{Codec: CodecUniform8})
	f.Add(b)
	b, _ = MarshalMessage([]Named{{"q", x}}, Options{Codec: CodecQuantile8})
	f.Add(b)
	f.Add([]byte{'S', 'K', 'M', 1, 0xff, 0xff})
	f.Fuzz(func(t *testing.T, b []byte) {
		msg, err := UnmarshalMessage(b, fuzzLimits)
		if err != nil {
			return
		}
		total := 0
		for _, e := range msg {
			total += len(e.Tensor.Data)
		}
		if len(msg) > fuzzLimits.MaxTensors || total > fuzzLimits.MaxElements {
			t.Fatalf("accepted %d tensors with %d elements", len(msg), total)
		}
	})
}

// FuzzRoundTrip encodes arbitrary float32 data with every codec and checks
// the documented error bounds after decoding.
func FuzzRoundTrip(f *testing.F) {
	f.Add([]byte{0, 0, 128, 63, 0, 0, 0, 192}, uint16(0))
	f.Add(bytes.Repeat([]byte{1, 2, 3, 4, 5, 6, 7, 8}, 100), uint16(7))
	f.Fuzz(func(t *testing.T, raw []byte, chunk uint16) {
		data := make([]float32, len(raw)/4)
		for i := range data {
			data[i] = math.Float32frombits(binary.LittleEndian.Uint32(raw[4*i:]))
		}
		x := tensor.FromSlice(data, len(data))
		for c := CodecNone; c <= CodecQuantile8; c++ {
			o := Options{Codec: c, ChunkSize: int(chunk)}
			b, err := Marshal(x, o)
			if err != nil {
				if (c == CodecUniform8 || c == CodecQuantile8) && err != nil {
					continue // non-finite input
				}
				t.Fatalf("%s: %v", c, err)
			}
			y, err := Unmarshal(b, Limits{})
			if err != nil {
				t.Fatalf("%s: decode own encoding: %v", c, err)
			}
			checkBounds(t, c, o, x.Data, y.Data)
		}
	})
}

func checkBounds(t *testing.T, c Codec, o Options, x, y []float32) {
	t.Helper()
	switch c {
	case CodecNone:
		for i := range x {
			if math.Float32bits(x[i]) != math.Float32bits(y[i]) {
				t.Fatalf("none: element %d %g -> %g", i, x[i], y[i])
			}
		}
	case CodecFP16:
		for i := range x {
			if math.IsNaN(float64(x[i])) != math.IsNaN(float64(y[i])) {
				t.Fatalf("fp16: NaN-ness of %g -> %g", x[i], y[i])
			}
			checkHalfRounding(t, x[i])
		}
	case CodecUniform8:
		cs := o.chunk(len(x))
		for s := 0; s < len(x); s += cs {
			part := x[s:min(s+cs, len(x))]
			lo, hi, _ := minMax(part)
			bound := (float64(hi)-float64(lo))/255/2*(1+1e-5) + 1e-6*math.Max(math.Abs(float64(lo)), math.Abs(float64(hi))) + 1e-40
			for i, v := range part {
				if e := math.Abs(float64(y[s+i]) - float64(v)); e > bound {
					t.Fatalf("uniform8: element %d %g -> %g, error %g > %g", s+i, v, y[s+i], e, bound)
				}
			}
		}
	case CodecQuantile8:
		cb, _ := quantileCodebook(x)
		for i, v := range x {
			j := max(sort.Search(codebookSize, func(k int) bool { return cb[k] >= v })-1, 0)
			gap := float64(cb[min(j+1, codebookSize-1)]) - float64(cb[j])
			if e := math.Abs(float64(y[i]) - float64(v)); e > gap/2*(1+1e-6)+1e-40 {
				t.Fatalf("quantile8: element %d %g -> %g, error %g > %g", i, v, y[i], e, gap/2)
			}
		}
	}
}
