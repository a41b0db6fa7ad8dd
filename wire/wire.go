// Package wire encodes float32 tensors for the network: a small header
// (magic, version, dtype, codec, shape) followed by little-endian data,
// optionally compressed to IEEE half precision or to 8 bits per element with
// uniform or quantile (codebook) quantization.
//
// Decoders treat their input as hostile: every size is checked against
// explicit Limits before anything is allocated, and memory grows only as data
// actually arrives, so a short message can never make the decoder allocate
// for the size its header claims.
//
// # Format (version 1)
//
//	offset size  field
//	0      3     magic "SKT"
//	3      1     version = 1
//	4      1     dtype   = 1 (float32; the only dtype so far)
//	5      1     codec   (0 none, 1 fp16, 2 uniform8, 3 quantile8)
//	6      1     ndim    (0 = scalar)
//	7      1     reserved, must be 0
//	8      4*nd  shape, uint32 little-endian each
//	...          codec parameters:
//	               none, fp16: nothing
//	               uniform8:   chunk uint32 (elements per chunk, >= 1)
//	               quantile8:  256 float32 codebook entries
//	...          data: n*4 bytes (none), n*2 (fp16), n (quantile8), or for
//	             uniform8 per chunk: offset float32, scale float32, then one
//	             byte per element of the chunk (the last chunk may be short)
//
// A message of several named tensors is "SKM", version 1, a uint16 count,
// then per tensor a uint8 name length, the name and the tensor encoding.
package wire

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"unsafe"

	"github.com/skyhive/skyhive/tensor"
)

// Codec selects how tensor elements are represented on the wire.
type Codec uint8

const (
	// CodecNone sends float32 elements unchanged (4 bytes each).
	CodecNone Codec = 0
	// CodecFP16 sends IEEE 754 half precision, rounded to nearest even
	// (2 bytes each). Relative error is at most 2^-11 for normal halves;
	// magnitudes above 65504 become ±Inf and below 2^-25 become ±0.
	CodecFP16 Codec = 1
	// CodecUniform8 sends one byte per element: x ≈ offset + code*scale with
	// offset = min and scale = (max-min)/255 per chunk. The absolute error is
	// at most scale/2 plus float32 rounding. Inputs must be finite.
	CodecUniform8 Codec = 2
	// CodecQuantile8 sends one byte per element indexing a 256-entry codebook
	// built from quantiles of the data (entry 0 is the minimum, entry 255 the
	// maximum, the others are means of equal-count ranges of a sorted
	// sample), each value mapped to its nearest entry. The absolute error is
	// at most half the gap between the two entries around the value. Inputs
	// must be finite.
	CodecQuantile8 Codec = 3
)

// String names the codec.
func (c Codec) String() string {
	switch c {
	case CodecNone:
		return "none"
	case CodecFP16:
		return "fp16"
	case CodecUniform8:
		return "uniform8"
	case CodecQuantile8:
		return "quantile8"
	}
	return fmt.Sprintf("codec(%d)", uint8(c))
}

// ParseCodec returns the codec named s (as printed by Codec.String).
func ParseCodec(s string) (Codec, error) {
	for c := CodecNone; c <= CodecQuantile8; c++ {
		if c.String() == s {
			return c, nil
		}
	}
	return 0, fmt.Errorf("wire: unknown codec %q", s)
}

const (
	version      = 1
	dtypeFloat32 = 1
	headerSize   = 8
	codebookSize = 256
	// ioChunk is the scratch size for converting data on its way through.
	ioChunk = 64 << 10
	// firstAlloc is how many elements a decoder allocates before it has
	// seen any data; it grows by 4x as data arrives.
	firstAlloc = 64 << 10
)

var (
	tensorMagic  = [3]byte{'S', 'K', 'T'}
	messageMagic = [3]byte{'S', 'K', 'M'}
	// nativeLE is a constant property of the machine, computed once.
	nativeLE = binary.NativeEndian.Uint16([]byte{1, 0}) == 1
)

// Errors returned (wrapped) by encoders and decoders.
var (
	// ErrFormat reports a malformed or unsupported encoding.
	ErrFormat = errors.New("wire: malformed encoding")
	// ErrLimit reports an encoding that exceeds the decoder's Limits.
	ErrLimit = errors.New("wire: limit exceeded")
	// ErrNonFinite reports NaN or Inf given to an 8-bit codec.
	ErrNonFinite = errors.New("wire: non-finite value cannot be quantized to 8 bits")
)

// Limits bound what a decoder accepts. Zero fields take the defaults.
type Limits struct {
	// MaxElements bounds the elements of one tensor and the total elements
	// of one message (default 1<<26, i.e. 256 MiB of float32).
	MaxElements int
	// MaxDims bounds the number of dimensions (default 8, at most 255).
	MaxDims int
	// MaxTensors bounds the tensors of one message (default 64).
	MaxTensors int
	// Shape, if set, is called with each tensor's shape after the size
	// limits and before anything is allocated for its data; an error
	// refuses the tensor (wrapped with ErrLimit). Decoders use it to hold
	// a tensor to the shape they expect before paying for it.
	Shape func(shape []int) error
}

// DefaultLimits returns the limits used for zero fields.
func DefaultLimits() Limits { return Limits{MaxElements: 1 << 26, MaxDims: 8, MaxTensors: 64} }

func (l Limits) withDefaults() Limits {
	d := DefaultLimits()
	if l.MaxElements <= 0 {
		l.MaxElements = d.MaxElements
	}
	if l.MaxDims <= 0 {
		l.MaxDims = d.MaxDims
	}
	if l.MaxDims > 255 {
		l.MaxDims = 255
	}
	if l.MaxTensors <= 0 {
		l.MaxTensors = d.MaxTensors
	}
	return l
}

// Options choose the encoding.
type Options struct {
	// Codec is the element representation.
	Codec Codec
	// ChunkSize is the number of elements sharing one offset and scale with
	// CodecUniform8; 0 means one chunk for the whole tensor.
	ChunkSize int
}

func (o Options) chunk(n int) int {
	if o.ChunkSize <= 0 || o.ChunkSize > n {
		return max(n, 1)
	}
	return o.ChunkSize
}

// EncodedSize returns the number of bytes Encode writes for t.
func EncodedSize(t *tensor.Tensor, o Options) int {
	n := len(t.Data)
	size := headerSize + 4*len(t.Shape)
	switch o.Codec {
	case CodecNone:
		size += 4 * n
	case CodecFP16:
		size += 2 * n
	case CodecUniform8:
		c := o.chunk(n)
		size += 4 + 8*((n+c-1)/c) + n // per-chunk parameters interleaved
	case CodecQuantile8:
		size += 4*codebookSize + n
	}
	return size
}

func checkTensor(t *tensor.Tensor, o Options) error {
	if t == nil {
		return fmt.Errorf("%w: nil tensor", ErrFormat)
	}
	if len(t.Shape) > 255 {
		return fmt.Errorf("%w: %d dimensions", ErrLimit, len(t.Shape))
	}
	n := 1
	for _, d := range t.Shape {
		if d < 0 || uint64(d) > math.MaxUint32 {
			return fmt.Errorf("%w: dimension %d out of range", ErrFormat, d)
		}
		n *= d
	}
	if n != len(t.Data) {
		return fmt.Errorf("%w: shape %v does not match %d elements", ErrFormat, t.Shape, len(t.Data))
	}
	if o.Codec > CodecQuantile8 {
		return fmt.Errorf("%w: unknown codec %d", ErrFormat, o.Codec)
	}
	if o.ChunkSize > 0 && uint64(o.ChunkSize) > math.MaxUint32 {
		return fmt.Errorf("%w: chunk size %d", ErrFormat, o.ChunkSize)
	}
	return nil
}

// Encode writes t to w in the format chosen by o. It streams the data
// through a small buffer (or, for CodecNone on little-endian machines,
// straight from t.Data) instead of building the whole encoding in memory.
func Encode(w io.Writer, t *tensor.Tensor, o Options) error {
	if err := checkTensor(t, o); err != nil {
		return err
	}
	hdr := make([]byte, 0, headerSize+4*len(t.Shape)+4)
	hdr = append(hdr, tensorMagic[:]...)
	hdr = append(hdr, version, dtypeFloat32, byte(o.Codec), byte(len(t.Shape)), 0)
	for _, d := range t.Shape {
		hdr = binary.LittleEndian.AppendUint32(hdr, uint32(d))
	}
	var err error
	switch o.Codec {
	case CodecNone:
		if _, err = w.Write(hdr); err == nil {
			err = writeF32(w, t.Data)
		}
	case CodecFP16:
		if _, err = w.Write(hdr); err == nil {
			err = writeF16(w, t.Data)
		}
	case CodecUniform8:
		err = writeUniform8(w, hdr, t.Data, o.chunk(len(t.Data)))
	case CodecQuantile8:
		err = writeQuantile8(w, hdr, t.Data)
	}
	if err != nil {
		return fmt.Errorf("wire: encode %s: %w", o.Codec, err)
	}
	return nil
}

// Marshal returns the encoding of t.
func Marshal(t *tensor.Tensor, o Options) ([]byte, error) {
	if err := checkTensor(t, o); err != nil {
		return nil, err
	}
	buf := &sliceWriter{b: make([]byte, 0, EncodedSize(t, o))}
	if err := Encode(buf, t, o); err != nil {
		return nil, err
	}
	return buf.b, nil
}

// Decode reads one tensor from r, reading exactly its encoding and nothing
// more. It rejects encodings beyond lim before allocating for them.
func Decode(r io.Reader, lim Limits) (*tensor.Tensor, error) {
	lim = lim.withDefaults()
	return decode(r, lim, lim.MaxElements)
}

// Unmarshal decodes a tensor from b, which must hold exactly one encoding.
func Unmarshal(b []byte, lim Limits) (*tensor.Tensor, error) {
	r := &sliceReader{b: b}
	t, err := Decode(r, lim)
	if err != nil {
		return nil, err
	}
	if len(r.b) != 0 {
		return nil, fmt.Errorf("%w: %d trailing bytes", ErrFormat, len(r.b))
	}
	return t, nil
}

// decode reads a tensor of at most budget elements.
func decode(r io.Reader, lim Limits, budget int) (*tensor.Tensor, error) {
	var hdr [headerSize]byte
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		return nil, fmt.Errorf("wire: read header: %w", eofIsUnexpected(err))
	}
	if [3]byte(hdr[:3]) != tensorMagic {
		return nil, fmt.Errorf("%w: bad magic %q", ErrFormat, hdr[:3])
	}
	if hdr[3] != version {
		return nil, fmt.Errorf("%w: version %d", ErrFormat, hdr[3])
	}
	if hdr[4] != dtypeFloat32 {
		return nil, fmt.Errorf("%w: dtype %d", ErrFormat, hdr[4])
	}
	codec := Codec(hdr[5])
	if codec > CodecQuantile8 {
		return nil, fmt.Errorf("%w: codec %d", ErrFormat, hdr[5])
	}
	ndim := int(hdr[6])
	if ndim > lim.MaxDims {
		return nil, fmt.Errorf("%w: %d dimensions > %d", ErrLimit, ndim, lim.MaxDims)
	}
	if hdr[7] != 0 {
		return nil, fmt.Errorf("%w: reserved byte %d", ErrFormat, hdr[7])
	}
	var dims [255 * 4]byte
	if _, err := io.ReadFull(r, dims[:4*ndim]); err != nil {
		return nil, fmt.Errorf("wire: read shape: %w", eofIsUnexpected(err))
	}
	shape := make([]int, ndim)
	n := 1
	for i := range shape {
		d := int(binary.LittleEndian.Uint32(dims[4*i:]))
		if d > budget {
			return nil, fmt.Errorf("%w: dimension %d > %d elements", ErrLimit, d, budget)
		}
		shape[i] = d
		if n != 0 && d > budget/n {
			return nil, fmt.Errorf("%w: shape %v over %d elements", ErrLimit, shape[:i+1], budget)
		}
		n *= d
	}
	if lim.Shape != nil {
		if err := lim.Shape(shape); err != nil {
			return nil, fmt.Errorf("%w: %w", ErrLimit, err)
		}
	}
	var data []float32
	var err error
	switch codec {
	case CodecNone:
		data, err = readF32(r, n)
	case CodecFP16:
		data, err = readF16(r, n)
	case CodecUniform8:
		data, err = readUniform8(r, n)
	case CodecQuantile8:
		data, err = readQuantile8(r, n)
	}
	if err != nil {
		return nil, fmt.Errorf("wire: decode %s: %w", codec, err)
	}
	return &tensor.Tensor{Shape: shape, Data: data}, nil
}

func eofIsUnexpected(err error) error {
	if err == io.EOF {
		return io.ErrUnexpectedEOF
	}
	return err
}

// grow returns data extended by up to step more elements (never beyond n),
// reallocating with 4x headroom so memory follows the data that arrived.
func grow(data []float32, n, step int) []float32 {
	want := min(len(data)+step, n)
	if want <= cap(data) {
		return data[:want]
	}
	c := min(max(4*cap(data), firstAlloc, want), n)
	nd := make([]float32, want, c)
	copy(nd, data)
	return nd
}

// f32Bytes views a float32 slice as bytes (little-endian machines only).
func f32Bytes(x []float32) []byte {
	if len(x) == 0 {
		return nil
	}
	return unsafe.Slice((*byte)(unsafe.Pointer(&x[0])), 4*len(x))
}

func writeF32(w io.Writer, data []float32) error {
	if nativeLE {
		// Write in bounded pieces so a writer that frames its input sees
		// reasonable sizes; no copy is made.
		const piece = 1 << 20
		for len(data) > 0 {
			k := min(len(data), piece)
			if _, err := w.Write(f32Bytes(data[:k])); err != nil {
				return err
			}
			data = data[k:]
		}
		return nil
	}
	buf := make([]byte, ioChunk)
	for len(data) > 0 {
		k := min(len(data), ioChunk/4)
		for i, v := range data[:k] {
			binary.LittleEndian.PutUint32(buf[4*i:], math.Float32bits(v))
		}
		if _, err := w.Write(buf[:4*k]); err != nil {
			return err
		}
		data = data[k:]
	}
	return nil
}

func readF32(r io.Reader, n int) ([]float32, error) {
	var data []float32
	var buf []byte
	if !nativeLE {
		buf = make([]byte, ioChunk)
	}
	for len(data) < n {
		start := len(data)
		data = grow(data, n, max(len(data), firstAlloc))
		dst := data[start:]
		if nativeLE {
			if _, err := io.ReadFull(r, f32Bytes(dst)); err != nil {
				return nil, eofIsUnexpected(err)
			}
			continue
		}
		for len(dst) > 0 {
			k := min(len(dst), ioChunk/4)
			if _, err := io.ReadFull(r, buf[:4*k]); err != nil {
				return nil, eofIsUnexpected(err)
			}
			for i := range dst[:k] {
				dst[i] = math.Float32frombits(binary.LittleEndian.Uint32(buf[4*i:]))
			}
			dst = dst[k:]
		}
	}
	return orEmpty(data), nil
}

// orEmpty makes a zero-element tensor's data non-nil for consistency.
func orEmpty(d []float32) []float32 {
	if d == nil {
		return []float32{}
	}
	return d
}

func writeF16(w io.Writer, data []float32) error {
	buf := make([]byte, ioChunk)
	for len(data) > 0 {
		k := min(len(data), ioChunk/2)
		for i, v := range data[:k] {
			binary.LittleEndian.PutUint16(buf[2*i:], Float32ToHalf(v))
		}
		if _, err := w.Write(buf[:2*k]); err != nil {
			return err
		}
		data = data[k:]
	}
	return nil
}

func readF16(r io.Reader, n int) ([]float32, error) {
	var data []float32
	buf := make([]byte, ioChunk)
	for len(data) < n {
		start := len(data)
		data = grow(data, n, ioChunk/2)
		dst := data[start:]
		if _, err := io.ReadFull(r, buf[:2*len(dst)]); err != nil {
			return nil, eofIsUnexpected(err)
		}
		for i := range dst {
			dst[i] = HalfToFloat32(binary.LittleEndian.Uint16(buf[2*i:]))
		}
	}
	return orEmpty(data), nil
}

// sliceWriter appends to a byte slice.
type sliceWriter struct{ b []byte }

func (w *sliceWriter) Write(p []byte) (int, error) {
	w.b = append(w.b, p...)
	return len(p), nil
}

// sliceReader consumes a byte slice.
type sliceReader struct{ b []byte }

func (r *sliceReader) Read(p []byte) (int, error) {
	if len(r.b) == 0 {
		return 0, io.EOF
	}
	n := copy(p, r.b)
	r.b = r.b[n:]
	return n, nil
}
