package wire

import (
	"sort"

	"bytes"
	"errors"
	"io"
	"math"
	"math/rand/v2"
	"runtime"
	"testing"

	"github.com/skyhive/skyhive/tensor"
)

func randTensor(rng *rand.Rand, shape ...int) *tensor.Tensor {
	t := tensor.New(shape...)
	for i := range t.Data {
		t.Data[i] = float32(rng.NormFloat64())
	}
	return t
}

func roundTrip(t *testing.T, x *tensor.Tensor, o Options) *tensor.Tensor {
	t.Helper()
	b, err := Marshal(x, o)
	if err != nil {
		t.Fatalf("Marshal(%s): %v", o.Codec, err)
	}
	if len(b) != EncodedSize(x, o) {
		t.Fatalf("%s: encoded %d bytes, EncodedSize says %d", o.Codec, len(b), EncodedSize(x, o))
	}
	y, err := Unmarshal(b, Limits{})
	if err != nil {
		t.Fatalf("Unmarshal(%s): %v", o.Codec, err)
	}
	if !tensor.SameShape(x.Shape, y.Shape) || len(y.Data) != len(x.Data) {
		t.Fatalf("%s: shape %v -> %v", o.Codec, x.Shape, y.Shape)
	}
	return y
}

func TestNoneExact(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	x := randTensor(rng, 3, 5, 7)
	x.Data[0] = float32(math.NaN())
	x.Data[1] = float32(math.Inf(-1))
	x.Data[2] = math.Float32frombits(1) // smallest subnormal
	y := roundTrip(t, x, Options{})
	for i := range x.Data {
		if math.Float32bits(x.Data[i]) != math.Float32bits(y.Data[i]) {
			t.Fatalf("element %d: %g -> %g", i, x.Data[i], y.Data[i])
		}
	}
}

func TestEmptyAndScalar(t *testing.T) {
	for c := CodecNone; c <= CodecQuantile8; c++ {
		for _, x := range []*tensor.Tensor{tensor.New(0), tensor.New(4, 0, 3), tensor.FromSlice([]float32{2.5})} {
			y := roundTrip(t, x, Options{Codec: c, ChunkSize: 3})
			if len(x.Data) == 1 && y.Data[0] != 2.5 {
				t.Fatalf("%s scalar: got %g", c, y.Data[0])
			}
		}
	}
}

func TestHalfSpecialValues(t *testing.T) {
	cases := []struct {
		in   float32
		want uint16
	}{
		{0, 0},
		{float32(math.Copysign(0, -1)), 0x8000},
		{1, 0x3c00},
		{-2, 0xc000},
		{65504, 0x7bff},
		{65519.99, 0x7bff},
		{65520, 0x7c00}, // tie between 65504 and 65536: even is Inf
		{1e10, 0x7c00},
		{float32(math.Inf(-1)), 0xfc00},
		{0x1p-24, 0x0001},      // smallest subnormal
		{0x1p-25, 0x0000},      // tie with zero: rounds to even 0
		{0x1.0002p-25, 0x0001}, // just above the tie
		{0x3p-25, 0x0002},      // tie between 1 and 2 units: even 2
		{0x1.ffcp-15, 0x0400},  // largest subnormal + half unit: carries to min normal
		{1 + 0x1p-11, 0x3c00},  // tie: even mantissa 0
		{1 + 0x3p-11, 0x3c02},  // tie: even mantissa 2
	}
	for _, c := range cases {
		if got := Float32ToHalf(c.in); got != c.want {
			t.Errorf("Float32ToHalf(%g) = %#04x, want %#04x", c.in, got, c.want)
		}
	}
	nan := Float32ToHalf(float32(math.NaN()))
	if nan&0x7c00 != 0x7c00 || nan&0x3ff == 0 {
		t.Errorf("NaN -> %#04x, not a NaN", nan)
	}
	// A signalling NaN whose payload sits in the low bits must stay NaN.
	if h := Float32ToHalf(math.Float32frombits(0x7f800001)); h&0x3ff == 0 {
		t.Errorf("low-payload NaN -> %#04x, became Inf", h)
	}
}

func TestHalfExhaustive(t *testing.T) {
	for h := 0; h < 1<<16; h++ {
		f := HalfToFloat32(uint16(h))
		if math.IsNaN(float64(f)) {
			if h&0x7c00 != 0x7c00 || h&0x3ff == 0 {
				t.Fatalf("%#04x decoded to NaN", h)
			}
			continue
		}
		if back := Float32ToHalf(f); back != uint16(h) {
			t.Fatalf("%#04x -> %g -> %#04x", h, f, back)
		}
	}
}

// checkHalfRounding verifies Float32ToHalf(x) is the nearest half, ties to
// even, by comparing with its neighbours in float64.
func checkHalfRounding(t *testing.T, x float32) {
	if math.IsNaN(float64(x)) {
		return
	}
	h := Float32ToHalf(x)
	ax := math.Abs(float64(x))
	mag := h & 0x7fff
	if (h&0x8000 != 0) != math.Signbit(float64(x)) {
		t.Fatalf("%g -> %#04x: wrong sign", x, h)
	}
	got := float64(HalfToFloat32(mag))
	if mag == 0x7c00 {
		// Inf is right iff |x| >= 65520 (the midpoint to the next binade).
		if ax < 65520 {
			t.Fatalf("%g -> Inf, should be finite", x)
		}
		return
	}
	d := math.Abs(got - ax)
	for _, nb := range []uint16{mag - 1, mag + 1} {
		if nb > 0x7bff || (mag == 0 && nb == 0xffff) {
			continue
		}
		dn := math.Abs(float64(HalfToFloat32(nb)) - ax)
		if dn < d || (dn == d && mag&1 == 1) {
			t.Fatalf("%g -> %#04x (%g), neighbour %#04x (%g) is nearer or even", x, h, got, nb, HalfToFloat32(nb))
		}
	}
}

func TestHalfRoundingRandom(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	for range 200000 {
		// Random exponents around the half range, random mantissas.
		exp := rng.IntN(50) - 30 + 127
		bits := uint32(exp)<<23 | rng.Uint32()&0x7fffff | rng.Uint32()&0x80000000
		checkHalfRounding(t, math.Float32frombits(bits))
	}
}

func TestFP16Bounds(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	x := randTensor(rng, 1000)
	y := roundTrip(t, x, Options{Codec: CodecFP16})
	for i, v := range x.Data {
		// Normal halves: relative error <= 2^-11; below that absolute <= 2^-25.
		if e := math.Abs(float64(y.Data[i] - v)); e > math.Abs(float64(v))*0x1p-11+0x1p-25 {
			t.Fatalf("element %d: %g -> %g", i, v, y.Data[i])
		}
	}
}

func TestUniform8Bounds(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 8))
	x := randTensor(rng, 50, 201)
	x.Data[17] = 40 // an outlier only hurts its own chunk
	for _, chunk := range []int{0, 1, 256, 1000, 1 << 20} {
		o := Options{Codec: CodecUniform8, ChunkSize: chunk}
		y := roundTrip(t, x, o)
		c := o.chunk(len(x.Data))
		for s := 0; s < len(x.Data); s += c {
			part := x.Data[s:min(s+c, len(x.Data))]
			lo, hi, _ := minMax(part)
			bound := float64(hi-lo)/255/2*(1+1e-5) + 1e-6*math.Max(math.Abs(float64(lo)), math.Abs(float64(hi)))
			for i, v := range part {
				if e := math.Abs(float64(y.Data[s+i] - v)); e > bound {
					t.Fatalf("chunk %d element %d: %g -> %g, error %g > %g", chunk, s+i, v, y.Data[s+i], e, bound)
				}
			}
		}
	}
	// Extreme range must not overflow to Inf or NaN.
	ext := tensor.FromSlice([]float32{-math.MaxFloat32, 0, math.MaxFloat32}, 3)
	y := roundTrip(t, ext, Options{Codec: CodecUniform8})
	for i, v := range y.Data {
		if !finite32(v) {
			t.Fatalf("extreme element %d decoded to %g", i, v)
		}
	}
	if y.Data[0] != -math.MaxFloat32 || y.Data[2] < math.MaxFloat32*0.999 {
		t.Fatalf("extremes decoded to %v", y.Data)
	}
}

func TestQuantile8Bounds(t *testing.T) {
	rng := rand.New(rand.NewPCG(9, 10))
	x := randTensor(rng, 300000) // larger than the quantile sample
	x.Data[5] = 1e3
	x.Data[6] = -1e3
	b, err := Marshal(x, Options{Codec: CodecQuantile8})
	if err != nil {
		t.Fatal(err)
	}
	cb, _ := quantileCodebook(x.Data)
	y, err := Unmarshal(b, Limits{})
	if err != nil {
		t.Fatal(err)
	}
	var mseQ float64
	for i, v := range x.Data {
		// Bound: half the gap between the entries around v.
		j := max(sort.Search(codebookSize, func(k int) bool { return cb[k] >= v })-1, 0)
		gap := float64(cb[min(j+1, codebookSize-1)] - cb[j])
		e := math.Abs(float64(y.Data[i] - v))
		if e > gap/2*(1+1e-6)+1e-7 {
			t.Fatalf("element %d: %g -> %g, error %g > gap/2 %g", i, v, y.Data[i], e, gap/2)
		}
		mseQ += e * e
	}
	if y.Data[5] != 1e3 || y.Data[6] != -1e3 {
		t.Fatalf("extremes not exact: %g %g", y.Data[5], y.Data[6])
	}
	// With outliers, quantiles must beat uniform steps by far.
	yu := roundTrip(t, x, Options{Codec: CodecUniform8})
	var mseU float64
	for i, v := range x.Data {
		d := float64(yu.Data[i] - v)
		mseU += d * d
	}
	if mseQ*10 > mseU {
		t.Fatalf("quantile MSE %g not well below uniform MSE %g", mseQ/float64(len(x.Data)), mseU/float64(len(x.Data)))
	}
	// Small tensors fit in the codebook exactly.
	small := randTensor(rng, 200)
	ys := roundTrip(t, small, Options{Codec: CodecQuantile8})
	for i := range small.Data {
		if small.Data[i] != ys.Data[i] {
			t.Fatalf("small element %d: %g -> %g", i, small.Data[i], ys.Data[i])
		}
	}
}

func TestNonFiniteRejected(t *testing.T) {
	for _, c := range []Codec{CodecUniform8, CodecQuantile8} {
		for _, bad := range []float64{math.NaN(), math.Inf(1)} {
			x := tensor.FromSlice([]float32{1, float32(bad), 2}, 3)
			if _, err := Marshal(x, Options{Codec: c}); !errors.Is(err, ErrNonFinite) {
				t.Errorf("%s with %g: err %v, want ErrNonFinite", c, bad, err)
			}
		}
	}
}

func TestBadInput(t *testing.T) {
	good, _ := Marshal(tensor.FromSlice([]float32{1, 2, 3, 4}, 2, 2), Options{})
	mut := func(f func(b []byte)) []byte { b := bytes.Clone(good); f(b); return b }
	cases := map[string]struct {
		b    []byte
		want error
	}{
		"magic":     {mut(func(b []byte) { b[0] = 'X' }), ErrFormat},
		"version":   {mut(func(b []byte) { b[3] = 9 }), ErrFormat},
		"dtype":     {mut(func(b []byte) { b[4] = 2 }), ErrFormat},
		"codec":     {mut(func(b []byte) { b[5] = 77 }), ErrFormat},
		"reserved":  {mut(func(b []byte) { b[7] = 1 }), ErrFormat},
		"ndim":      {mut(func(b []byte) { b[6] = 9 }), ErrLimit},
		"dim":       {mut(func(b []byte) { b[8], b[9], b[10], b[11] = 0xff, 0xff, 0xff, 0xff }), ErrLimit},
		"truncated": {good[:len(good)-1], io.ErrUnexpectedEOF},
		"header":    {good[:5], io.ErrUnexpectedEOF},
		"empty":     {nil, io.ErrUnexpectedEOF},
		"trailing":  {append(bytes.Clone(good), 0), ErrFormat},
	}
	for name, c := range cases {
		if _, err := Unmarshal(c.b, Limits{}); !errors.Is(err, c.want) {
			t.Errorf("%s: err %v, want %v", name, err, c.want)
		}
	}
	// Product of dimensions over the limit, each dimension under it.
	b, _ := Marshal(tensor.New(1000, 1000), Options{Codec: CodecFP16})
	if _, err := Unmarshal(b, Limits{MaxElements: 999999}); !errors.Is(err, ErrLimit) {
		t.Errorf("product over limit: err %v", err)
	}
	// Bad quantization parameters.
	u, _ := Marshal(tensor.FromSlice([]float32{1, 2}, 2), Options{Codec: CodecUniform8})
	nanScale := bytes.Clone(u)
	copy(nanScale[16:], []byte{0, 0, 0xc0, 0x7f})
	if _, err := Unmarshal(nanScale, Limits{}); !errors.Is(err, ErrFormat) {
		t.Errorf("NaN scale: err %v", err)
	}
	zeroChunk := bytes.Clone(u)
	copy(zeroChunk[12:], []byte{0, 0, 0, 0})
	if _, err := Unmarshal(zeroChunk, Limits{}); !errors.Is(err, ErrFormat) {
		t.Errorf("zero chunk: err %v", err)
	}
}

// TestNoAllocationForClaims checks a header claiming a huge tensor with no
// data behind it costs no more than a small, fixed amount of memory.
func TestNoAllocationForClaims(t *testing.T) {
	for c := CodecNone; c <= CodecQuantile8; c++ {
		b := []byte{'S', 'K', 'T', 1, 1, byte(c), 1, 0, 0, 0, 0, 4} // 1<<26 elements
		if c == CodecUniform8 {
			b = append(b, 0, 0, 0, 4)
		}
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		_, err := Unmarshal(b, Limits{})
		runtime.ReadMemStats(&after)
		if !errors.Is(err, io.ErrUnexpectedEOF) {
			t.Fatalf("%s: err %v", c, err)
		}
		if got := after.TotalAlloc - before.TotalAlloc; got > 2<<20 {
			t.Errorf("%s: allocated %d bytes for an empty body", c, got)
		}
	}
}

func TestDecodeReadsExactly(t *testing.T) {
	rng := rand.New(rand.NewPCG(11, 12))
	var buf bytes.Buffer
	var xs []*tensor.Tensor
	for c := CodecNone; c <= CodecQuantile8; c++ {
		x := randTensor(rng, 7, 3000)
		xs = append(xs, x)
		if err := Encode(&buf, x, Options{Codec: c, ChunkSize: 100}); err != nil {
			t.Fatal(err)
		}
	}
	// A reader returning one byte at a time exercises every partial read.
	r := io.Reader(&oneByteReader{r: &buf})
	for i := range xs {
		y, err := Decode(r, Limits{})
		if err != nil {
			t.Fatalf("tensor %d: %v", i, err)
		}
		if !tensor.SameShape(y.Shape, xs[i].Shape) {
			t.Fatalf("tensor %d: shape %v", i, y.Shape)
		}
	}
	if _, err := Decode(r, Limits{}); !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Fatalf("after last tensor: err %v", err)
	}
}

type oneByteReader struct{ r io.Reader }

func (o *oneByteReader) Read(p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	return o.r.Read(p[:1])
}

func TestLargeNoneGrowth(t *testing.T) {
	// Bigger than several growth steps; checks data integrity through grow.
	n := 3<<20 + 17
	x := tensor.New(n)
	for i := range x.Data {
		x.Data[i] = float32(i)
	}
	y := roundTrip(t, x, Options{})
	for i, v := range y.Data {
		if v != float32(i) {
			t.Fatalf("element %d = %g", i, v)
		}
	}
}

func TestMessage(t *testing.T) {
	rng := rand.New(rand.NewPCG(13, 14))
	msg := []Named{
		{"input", randTensor(rng, 4, 16)},
		{"mask", randTensor(rng, 4)},
		{"", tensor.FromSlice([]float32{3}, 1)},
	}
	b, err := MarshalMessage(msg, Options{Codec: CodecFP16})
	if err != nil {
		t.Fatal(err)
	}
	got, err := UnmarshalMessage(b, Limits{})
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 3 || got[0].Name != "input" || Get(got, "mask") == nil || Get(got, "nope") != nil {
		t.Fatalf("decoded %v", got)
	}
	if e := Get(got, ""); e == nil || e.Data[0] != 3 {
		t.Fatalf("unnamed entry %v", e)
	}
	if _, err := UnmarshalMessage(b, Limits{MaxTensors: 2}); !errors.Is(err, ErrLimit) {
		t.Errorf("MaxTensors: err %v", err)
	}
	// The element limit applies to the sum over the message.
	if _, err := UnmarshalMessage(b, Limits{MaxElements: 4*16 + 4}); !errors.Is(err, ErrLimit) {
		t.Errorf("total elements: err %v", err)
	}
	if _, err := MarshalMessage([]Named{{"a", msg[1].Tensor}, {"a", msg[1].Tensor}}, Options{}); !errors.Is(err, ErrFormat) {
		t.Errorf("duplicate names: err %v", err)
	}
	dup, _ := MarshalMessage([]Named{{"a", msg[1].Tensor}, {"b", msg[1].Tensor}}, Options{})
	dup[bytes.LastIndexByte(dup, 'b')] = 'a'
	if _, err := UnmarshalMessage(dup, Limits{}); !errors.Is(err, ErrFormat) {
		t.Errorf("decoded duplicate names: err %v", err)
	}
	if _, err := UnmarshalMessage(b[:len(b)-1], Limits{}); !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Errorf("truncated message: err %v", err)
	}
}

func TestParseCodec(t *testing.T) {
	for c := CodecNone; c <= CodecQuantile8; c++ {
		if got, err := ParseCodec(c.String()); err != nil || got != c {
			t.Errorf("ParseCodec(%q) = %v, %v", c.String(), got, err)
		}
	}
	if _, err := ParseCodec("int4"); err == nil {
		t.Error("ParseCodec accepted int4")
	}
}

// Limits.Shape sees each tensor's shape before its data is read: a
// message whose data is missing altogether is refused by the shape check,
// not by the truncation, and a shape it accepts decodes as usual.
func TestLimitsShapeBeforeData(t *testing.T) {
	x := tensor.New(2, 3)
	b, err := MarshalMessage([]Named{{Name: "x", Tensor: x}}, Options{})
	if err != nil {
		t.Fatal(err)
	}
	errShape := errors.New("wrong shape")
	only23 := Limits{Shape: func(s []int) error {
		if len(s) != 2 || s[0] != 2 || s[1] != 3 {
			return errShape
		}
		return nil
	}}
	if _, err := UnmarshalMessage(b, only23); err != nil {
		t.Fatalf("accepted shape refused: %v", err)
	}
	y, err := MarshalMessage([]Named{{Name: "x", Tensor: tensor.New(3, 2)}}, Options{})
	if err != nil {
		t.Fatal(err)
	}
	headerOnly := y[:len(y)-6*4]
	if _, err := UnmarshalMessage(headerOnly, only23); !errors.Is(err, errShape) || !errors.Is(err, ErrLimit) {
		t.Fatalf("got %v, want the shape error wrapped in ErrLimit", err)
	}
}
