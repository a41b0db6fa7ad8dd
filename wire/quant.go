package wire

import (
	"bufio"
	"encoding/binary"
	"fmt"
	"io"
	"math"
	"slices"
)

// quantileSample bounds the sample sorted to find quantiles.
const quantileSample = 1 << 16

func finite32(v float32) bool {
	return !math.IsNaN(float64(v)) && !math.IsInf(float64(v), 0)
}

func minMax(data []float32) (lo, hi float32, err error) {
	if len(data) == 0 {
		return 0, 0, nil
	}
	lo, hi = data[0], data[0]
	for _, v := range data {
		if !finite32(v) {
			return 0, 0, ErrNonFinite
		}
		lo = min(lo, v)
		hi = max(hi, v)
	}
	return lo, hi, nil
}

// uniformParams returns offset and scale covering [lo, hi] in 255 steps.
func uniformParams(lo, hi float32) (offset, scale float32) {
	return lo, float32((float64(hi) - float64(lo)) / 255)
}

func uniformCode(v, offset, scale float32) byte {
	if scale == 0 {
		return 0
	}
	q := math.Round((float64(v) - float64(offset)) / float64(scale))
	return byte(min(max(q, 0), 255))
}

func uniformValue(code byte, offset, scale float32) float32 {
	v := float64(offset) + float64(code)*float64(scale)
	return float32(min(max(v, -math.MaxFloat32), math.MaxFloat32))
}

// writeUniform8 writes the header, the chunk size and, per chunk, its
// offset and scale followed by its codes.
func writeUniform8(w io.Writer, hdr []byte, data []float32, chunk int) error {
	bw := bufio.NewWriterSize(w, ioChunk)
	bw.Write(hdr) // errors are sticky in bufio and reported by Flush
	var p [8]byte
	binary.LittleEndian.PutUint32(p[:4], uint32(chunk))
	bw.Write(p[:4])
	for start := 0; start < len(data); start += chunk {
		c := data[start:min(start+chunk, len(data))]
		lo, hi, err := minMax(c)
		if err != nil {
			return err
		}
		off, scale := uniformParams(lo, hi)
		binary.LittleEndian.PutUint32(p[:4], math.Float32bits(off))
		binary.LittleEndian.PutUint32(p[4:], math.Float32bits(scale))
		bw.Write(p[:])
		for _, v := range c {
			bw.WriteByte(uniformCode(v, off, scale))
		}
	}
	return bw.Flush()
}

func readUniform8(r io.Reader, n int) ([]float32, error) {
	var p [8]byte
	if _, err := io.ReadFull(r, p[:4]); err != nil {
		return nil, eofIsUnexpected(err)
	}
	chunk := int(binary.LittleEndian.Uint32(p[:4]))
	if chunk < 1 || chunk > max(n, 1) {
		return nil, fmt.Errorf("%w: chunk size %d for %d elements", ErrFormat, chunk, n)
	}
	var data []float32
	buf := make([]byte, min(ioChunk, max(n, 1)))
	for len(data) < n {
		if _, err := io.ReadFull(r, p[:]); err != nil {
			return nil, eofIsUnexpected(err)
		}
		off := math.Float32frombits(binary.LittleEndian.Uint32(p[:4]))
		scale := math.Float32frombits(binary.LittleEndian.Uint32(p[4:]))
		if !finite32(off) || !finite32(scale) || scale < 0 {
			return nil, fmt.Errorf("%w: uniform8 offset %g scale %g", ErrFormat, off, scale)
		}
		for m := min(chunk, n-len(data)); m > 0; {
			k := min(m, len(buf))
			start := len(data)
			data = grow(data, n, k)
			if _, err := io.ReadFull(r, buf[:k]); err != nil {
				return nil, eofIsUnexpected(err)
			}
			for i, c := range buf[:k] {
				data[start+i] = uniformValue(c, off, scale)
			}
			m -= k
		}
	}
	return orEmpty(data), nil
}

// quantileCodebook builds the sorted 256-entry codebook for data, whose
// values must be finite: the minimum, 254 means of equal-count ranges of a
// sorted sample, and the maximum.
func quantileCodebook(data []float32) (cb [codebookSize]float32, err error) {
	lo, hi, err := minMax(data)
	if err != nil || len(data) == 0 {
		return cb, err
	}
	n := len(data)
	m := min(n, quantileSample)
	sample := make([]float32, m)
	for j := range sample {
		sample[j] = data[int(int64(j)*int64(n)/int64(m))]
	}
	slices.Sort(sample)
	const inner = codebookSize - 2
	cb[0], cb[codebookSize-1] = lo, hi
	for k := 1; k <= inner; k++ {
		a, b := (k-1)*m/inner, k*m/inner
		if a == b {
			cb[k] = sample[min(a, m-1)]
			continue
		}
		var s float64
		for _, v := range sample[a:b] {
			s += float64(v)
		}
		cb[k] = min(max(float32(s/float64(b-a)), lo), hi)
	}
	// Float rounding of means cannot break the order of disjoint sorted
	// ranges by more than an ulp; make the order exact for the search.
	for k := 1; k < codebookSize; k++ {
		cb[k] = max(cb[k], cb[k-1])
	}
	return cb, nil
}

// nearestCode returns the index of the codebook entry closest to v; cb must
// be sorted.
func nearestCode(cb *[codebookSize]float32, v float32) byte {
	i := 0 // count of entries below v, found by binary search
	for step := codebookSize / 2; step > 0; step >>= 1 {
		if cb[i+step-1] < v {
			i += step
		}
	}
	if i == codebookSize-1 && cb[i] < v {
		i = codebookSize
	}
	switch {
	case i == 0:
		return 0
	case i == codebookSize:
		return codebookSize - 1
	case float64(v)-float64(cb[i-1]) <= float64(cb[i])-float64(v):
		return byte(i - 1)
	}
	return byte(i)
}

func writeQuantile8(w io.Writer, hdr []byte, data []float32) error {
	cb, err := quantileCodebook(data)
	if err != nil {
		return err
	}
	bw := bufio.NewWriterSize(w, ioChunk)
	bw.Write(hdr) // errors are sticky in bufio and reported by Flush
	var p [4]byte
	for _, v := range cb {
		binary.LittleEndian.PutUint32(p[:], math.Float32bits(v))
		bw.Write(p[:])
	}
	for _, v := range data {
		bw.WriteByte(nearestCode(&cb, v))
	}
	return bw.Flush()
}

func readQuantile8(r io.Reader, n int) ([]float32, error) {
	var raw [4 * codebookSize]byte
	if _, err := io.ReadFull(r, raw[:]); err != nil {
		return nil, eofIsUnexpected(err)
	}
	var cb [codebookSize]float32
	for i := range cb {
		cb[i] = math.Float32frombits(binary.LittleEndian.Uint32(raw[4*i:]))
		if !finite32(cb[i]) {
			return nil, fmt.Errorf("%w: quantile8 codebook entry %d is %g", ErrFormat, i, cb[i])
		}
	}
	var data []float32
	buf := make([]byte, min(ioChunk, max(n, 1)))
	for len(data) < n {
		start := len(data)
		data = grow(data, n, len(buf))
		dst := data[start:]
		if _, err := io.ReadFull(r, buf[:len(dst)]); err != nil {
			return nil, eofIsUnexpected(err)
		}
		for i, c := range buf[:len(dst)] {
			dst[i] = cb[c]
		}
	}
	return orEmpty(data), nil
}
