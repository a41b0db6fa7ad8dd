package checkpoint

import (
	"bytes"
	"cmp"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"slices"
	"unicode/utf8"

	"github.com/skyhive/skyhive/tensor"
)

// Decode reads one safetensors-encoded checkpoint from r, consuming exactly
// its bytes, so several can follow each other on a stream. maxBytes bounds
// the whole encoding (length prefix, header and data): nothing larger is
// read or allocated. If the metadata holds ChecksumKey the digest is
// verified and File.Verified is set; a mismatch is an error wrapping
// ErrChecksum. Malformed input gives an error wrapping ErrFormat or
// ErrTruncated.
func Decode(r io.Reader, maxBytes int64) (*File, error) {
	f, _, err := decode(r, maxBytes)
	if err != nil {
		return nil, fmt.Errorf("checkpoint: decode: %w", err)
	}
	return f, nil
}

// decode implements Decode and also returns the number of bytes consumed.
func decode(r io.Reader, maxBytes int64) (*File, int64, error) {
	var lenBuf [8]byte
	if n, err := io.ReadFull(r, lenBuf[:]); err != nil {
		if n == 0 && err == io.EOF || err == io.ErrUnexpectedEOF {
			return nil, 0, fmt.Errorf("%w: only %d bytes, less than the 8-byte header length", ErrTruncated, n)
		}
		return nil, 0, fmt.Errorf("reading header length: %w", err)
	}
	hlen := binary.LittleEndian.Uint64(lenBuf[:])
	switch {
	case hlen < 2:
		return nil, 0, fmt.Errorf("%w: header length %d is too short for a JSON object", ErrFormat, hlen)
	case hlen > MaxHeaderBytes:
		return nil, 0, fmt.Errorf("%w: header length %d exceeds the limit of %d bytes", ErrFormat, hlen, MaxHeaderBytes)
	case maxBytes < 8 || hlen > uint64(maxBytes-8):
		return nil, 0, fmt.Errorf("%w: header length %d exceeds the %d bytes available", ErrTruncated, hlen, max(maxBytes-8, 0))
	}
	// bytes.Buffer grows as data arrives, so a lying length costs nothing.
	var hb bytes.Buffer
	if n, err := io.CopyN(&hb, r, int64(hlen)); err != nil {
		if err == io.EOF {
			return nil, 0, fmt.Errorf("%w: header ends after %d of %d bytes", ErrTruncated, n, hlen)
		}
		return nil, 0, fmt.Errorf("reading header: %w", err)
	}
	entries, meta, err := parseHeader(hb.Bytes())
	if err != nil {
		return nil, 0, err
	}

	avail := maxBytes - 8 - int64(hlen)
	dataLen, err := layout(entries, avail)
	if err != nil {
		return nil, 0, err
	}
	if dataLen > uint64(avail) {
		return nil, 0, fmt.Errorf("%w: data buffer of %d bytes exceeds the %d bytes available", ErrTruncated, dataLen, avail)
	}

	h := sha256.New()
	hashHeader(h, entries, meta)
	tensors := make(map[string]*tensor.Tensor, len(entries))
	chunk := make([]byte, min(1<<16, dataLen))
	var done uint64
	for _, e := range entries {
		data := make([]float32, e.numElements)
		for rest := data; len(rest) > 0; {
			k := min(len(chunk)/4, len(rest))
			if n, err := io.ReadFull(r, chunk[:4*k]); err != nil {
				if err == io.EOF || err == io.ErrUnexpectedEOF {
					return nil, 0, fmt.Errorf("%w: data buffer ends after %d of %d bytes (in tensor %q)", ErrTruncated, done+uint64(n), dataLen, e.name)
				}
				return nil, 0, fmt.Errorf("reading tensor %q: %w", e.name, err)
			}
			h.Write(chunk[:4*k])
			for i := range k {
				rest[i] = math.Float32frombits(binary.LittleEndian.Uint32(chunk[4*i:]))
			}
			rest = rest[k:]
			done += uint64(4 * k)
		}
		tensors[e.name] = &tensor.Tensor{Shape: e.shape, Data: data}
	}

	f := &File{Tensors: tensors, Meta: meta}
	if stored, ok := meta[ChecksumKey]; ok {
		want, err := hex.DecodeString(stored)
		if err != nil || len(want) != sha256.Size {
			return nil, 0, fmt.Errorf("%w: %s %q is not a hex SHA-256 digest", ErrFormat, ChecksumKey, stored)
		}
		if got := h.Sum(nil); !bytes.Equal(got, want) {
			return nil, 0, fmt.Errorf("%w: stored %s, computed %x: the header or data is corrupt", ErrChecksum, stored, got)
		}
		delete(meta, ChecksumKey)
		f.Verified = true
	}
	return f, 8 + int64(hlen) + int64(dataLen), nil
}

// parseHeader decodes the JSON header. It walks the top-level object token
// by token so duplicate names are caught (encoding/json would keep the
// last one silently).
func parseHeader(hdr []byte) ([]entry, map[string]string, error) {
	if !utf8.Valid(hdr) {
		return nil, nil, fmt.Errorf("%w: header is not valid UTF-8", ErrFormat)
	}
	if trimmed := bytes.TrimLeft(hdr, " "); len(trimmed) == 0 || trimmed[0] != '{' {
		return nil, nil, fmt.Errorf("%w: header does not start with '{'", ErrFormat)
	}
	dec := json.NewDecoder(bytes.NewReader(hdr))
	dec.DisallowUnknownFields()
	if err := expectDelim(dec, '{'); err != nil {
		return nil, nil, err
	}
	seen := make(map[string]bool)
	var entries []entry
	meta := make(map[string]string)
	for dec.More() {
		name, err := stringToken(dec)
		if err != nil {
			return nil, nil, err
		}
		if seen[name] {
			return nil, nil, fmt.Errorf("%w: header: duplicate key %q", ErrFormat, name)
		}
		seen[name] = true
		if name == metadataKey {
			if meta, err = parseMetadata(dec); err != nil {
				return nil, nil, err
			}
			continue
		}
		var he headerEntry
		if err := dec.Decode(&he); err != nil {
			return nil, nil, fmt.Errorf("%w: header entry %q: %w", ErrFormat, name, err)
		}
		e, err := checkEntry(name, he)
		if err != nil {
			return nil, nil, err
		}
		entries = append(entries, e)
	}
	if err := expectDelim(dec, '}'); err != nil {
		return nil, nil, err
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, nil, fmt.Errorf("%w: header: content after the JSON object", ErrFormat)
	}
	return entries, meta, nil
}

// parseMetadata decodes the "__metadata__" object of string values,
// rejecting duplicate keys.
func parseMetadata(dec *json.Decoder) (map[string]string, error) {
	if err := expectDelim(dec, '{'); err != nil {
		return nil, fmt.Errorf("%s: %w", metadataKey, err)
	}
	meta := make(map[string]string)
	for dec.More() {
		k, err := stringToken(dec)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", metadataKey, err)
		}
		v, err := stringToken(dec)
		if err != nil {
			return nil, fmt.Errorf("%s[%q]: %w", metadataKey, k, err)
		}
		if _, dup := meta[k]; dup {
			return nil, fmt.Errorf("%w: %s: duplicate key %q", ErrFormat, metadataKey, k)
		}
		meta[k] = v
	}
	if err := expectDelim(dec, '}'); err != nil {
		return nil, fmt.Errorf("%s: %w", metadataKey, err)
	}
	return meta, nil
}

// expectDelim reads the next token and checks that it is the delimiter d.
func expectDelim(dec *json.Decoder, d json.Delim) error {
	tok, err := dec.Token()
	if err != nil {
		return fmt.Errorf("%w: header JSON: %w", ErrFormat, err)
	}
	if tok != d {
		return fmt.Errorf("%w: header JSON: found %v where %v was expected", ErrFormat, tok, d)
	}
	return nil
}

// stringToken reads the next token and checks that it is a string.
func stringToken(dec *json.Decoder) (string, error) {
	tok, err := dec.Token()
	if err != nil {
		return "", fmt.Errorf("%w: header JSON: %w", ErrFormat, err)
	}
	s, ok := tok.(string)
	if !ok {
		return "", fmt.Errorf("%w: header JSON: found %v where a string was expected", ErrFormat, tok)
	}
	return s, nil
}

// checkEntry validates one tensor record and computes its element count.
func checkEntry(name string, he headerEntry) (entry, error) {
	bad := func(format string, args ...any) (entry, error) {
		return entry{}, fmt.Errorf("%w: tensor %q: %s", ErrFormat, name, fmt.Sprintf(format, args...))
	}
	if name == "" {
		return bad("empty name")
	}
	if he.Dtype != "F32" {
		return bad("dtype %q is not supported (only F32)", he.Dtype)
	}
	if len(he.DataOffsets) != 2 {
		return bad("data_offsets has %d values, want 2", len(he.DataOffsets))
	}
	begin, end := he.DataOffsets[0], he.DataOffsets[1]
	if begin > end {
		return bad("data_offsets [%d, %d] are reversed", begin, end)
	}
	if len(he.Shape) > maxRank {
		return bad("rank %d exceeds %d", len(he.Shape), maxRank)
	}
	// Check every dimension first: with a zero dimension the product is 0
	// whatever the others are.
	for _, d := range he.Shape {
		if d < 0 {
			return bad("negative dimension in shape %v", he.Shape)
		}
	}
	n := uint64(1)
	if slices.Contains(he.Shape, 0) {
		n = 0
	}
	for _, d := range he.Shape {
		if n == 0 {
			break
		}
		if n > (end-begin)/4/uint64(d) {
			return bad("shape %v needs more than the %d bytes of data_offsets", he.Shape, end-begin)
		}
		n *= uint64(d)
	}
	if n*4 != end-begin {
		return bad("shape %v has %d float32s but data_offsets [%d, %d] hold %d bytes", he.Shape, n, begin, end, end-begin)
	}
	return entry{name: name, dtype: he.Dtype, shape: nonNil(he.Shape), begin: begin, end: end, numElements: int(n)}, nil
}

// layout sorts entries by offset and checks that they tile the data buffer
// from 0 without gaps or overlaps. It returns the buffer length.
func layout(entries []entry, avail int64) (uint64, error) {
	slices.SortFunc(entries, func(a, b entry) int {
		if a.begin != b.begin {
			return cmp.Compare(a.begin, b.begin)
		}
		return cmp.Compare(a.end, b.end)
	})
	var cursor uint64
	for _, e := range entries {
		if e.begin != cursor {
			if e.begin < cursor {
				return 0, fmt.Errorf("%w: tensor %q at [%d, %d] overlaps the previous tensor ending at %d", ErrFormat, e.name, e.begin, e.end, cursor)
			}
			return 0, fmt.Errorf("%w: gap in the data buffer: bytes [%d, %d) before tensor %q belong to no tensor", ErrFormat, cursor, e.begin, e.name)
		}
		if avail >= 0 && e.end > uint64(avail) {
			return 0, fmt.Errorf("%w: tensor %q ends at byte %d of the data buffer but only %d bytes are available", ErrTruncated, e.name, e.end, avail)
		}
		cursor = e.end
	}
	return cursor, nil
}
