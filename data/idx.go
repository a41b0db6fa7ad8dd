package data

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
)

// IDX element type codes (the third byte of the magic number).
const (
	idxTypeUbyte  = 0x08
	idxTypeSbyte  = 0x09
	idxTypeShort  = 0x0B
	idxTypeInt    = 0x0C
	idxTypeFloat  = 0x0D
	idxTypeDouble = 0x0E
)

// maxIDXRank bounds the number of dimensions accepted in an IDX header.
const maxIDXRank = 8

// ErrIDXFormat is wrapped by every error that reports a malformed IDX stream.
var ErrIDXFormat = errors.New("malformed IDX data")

// IDX is a decoded IDX array of unsigned bytes: Dims holds the dimensions
// from the header and Data the row-major elements.
type IDX struct {
	Dims []int
	Data []byte
}

// ReadIDX decodes an IDX stream of unsigned bytes (element type 0x08, the
// type MNIST-style files use) from r. The header is validated before any
// large allocation: the rank must be 1..8 and the product of the dimensions
// at most maxElems. The buffer for the elements grows as data actually
// arrives, so a lying header cannot make ReadIDX allocate much more than the
// stream holds. Trailing bytes after the last element are an error; reading
// to the end also lets a gzip reader verify its checksum.
func ReadIDX(r io.Reader, maxElems int) (*IDX, error) {
	return readIDX(r, maxElems, 0)
}

// readIDX is ReadIDX with a trusted upper bound on the stream's size (0 if
// unknown), which lets it allocate the data buffer in one go.
func readIDX(r io.Reader, maxElems, sizeBound int) (*IDX, error) {
	var magic [4]byte
	if _, err := io.ReadFull(r, magic[:]); err != nil {
		return nil, fmt.Errorf("%w: reading magic number: %w", ErrIDXFormat, noEOF(err))
	}
	if magic[0] != 0 || magic[1] != 0 {
		return nil, fmt.Errorf("%w: bad magic number %#08x (want 0x0000TTRR)", ErrIDXFormat, binary.BigEndian.Uint32(magic[:]))
	}
	switch magic[2] {
	case idxTypeUbyte:
	case idxTypeSbyte, idxTypeShort, idxTypeInt, idxTypeFloat, idxTypeDouble:
		return nil, fmt.Errorf("%w: element type %#02x is not supported (only unsigned bytes, 0x08)", ErrIDXFormat, magic[2])
	default:
		return nil, fmt.Errorf("%w: unknown element type %#02x", ErrIDXFormat, magic[2])
	}
	rank := int(magic[3])
	if rank < 1 || rank > maxIDXRank {
		return nil, fmt.Errorf("%w: rank %d out of range 1..%d", ErrIDXFormat, rank, maxIDXRank)
	}
	hdr := make([]byte, 4*rank)
	if _, err := io.ReadFull(r, hdr); err != nil {
		return nil, fmt.Errorf("%w: reading %d dimensions: %w", ErrIDXFormat, rank, noEOF(err))
	}
	dims := make([]int, rank)
	total := 1
	for i := range dims {
		d := binary.BigEndian.Uint32(hdr[4*i:])
		if uint64(d) > uint64(maxElems) {
			return nil, fmt.Errorf("%w: dimension %d is %d, more than the limit of %d elements", ErrIDXFormat, i, d, maxElems)
		}
		dims[i] = int(d)
		if dims[i] != 0 && total > maxElems/dims[i] {
			return nil, fmt.Errorf("%w: dimensions %v exceed the limit of %d elements", ErrIDXFormat, dimsSoFar(hdr, i+1), maxElems)
		}
		total *= dims[i]
	}
	buf, err := readExactly(r, total, sizeBound)
	if err != nil {
		return nil, fmt.Errorf("%w: header %v promises %d bytes of data: %w", ErrIDXFormat, dims, total, err)
	}
	var one [1]byte
	switch n, err := io.ReadFull(r, one[:]); {
	case n > 0:
		return nil, fmt.Errorf("%w: trailing bytes after the %d elements of %v", ErrIDXFormat, total, dims)
	case err != io.EOF:
		return nil, fmt.Errorf("%w: after the data: %w", ErrIDXFormat, err)
	}
	return &IDX{Dims: dims, Data: buf}, nil
}

// dimsSoFar decodes the first n big-endian dimensions of hdr for messages.
func dimsSoFar(hdr []byte, n int) []uint32 {
	out := make([]uint32, n)
	for i := range out {
		out[i] = binary.BigEndian.Uint32(hdr[4*i:])
	}
	return out
}

// readExactly reads exactly n bytes from r. Its buffer starts at
// max(1 MiB, sizeBound) capped at n, and doubles as data arrives, so memory
// tracks what the stream really holds.
func readExactly(r io.Reader, n, sizeBound int) ([]byte, error) {
	buf := make([]byte, 0, min(n, max(1<<20, sizeBound)))
	for len(buf) < n {
		if len(buf) == cap(buf) {
			grown := make([]byte, len(buf), min(n, 2*cap(buf)))
			copy(grown, buf)
			buf = grown
		}
		m, err := io.ReadFull(r, buf[len(buf):cap(buf)])
		buf = buf[:len(buf)+m]
		if err != nil {
			if err == io.EOF || err == io.ErrUnexpectedEOF {
				return nil, fmt.Errorf("truncated after %d of %d bytes: %w", len(buf), n, io.ErrUnexpectedEOF)
			}
			return nil, err
		}
	}
	return buf, nil
}

// noEOF turns a bare io.EOF (an empty stream) into io.ErrUnexpectedEOF.
func noEOF(err error) error {
	if err == io.EOF {
		return io.ErrUnexpectedEOF
	}
	return err
}
