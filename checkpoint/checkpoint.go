// Package checkpoint saves and loads named float32 tensors plus string
// metadata in the safetensors format, with an integrity checksum and atomic
// replacement of the file on disk.
//
// A file is an 8-byte little-endian header length N, N bytes of JSON header
// and the data buffer. The header maps each tensor name to
// {"dtype":"F32","shape":[...],"data_offsets":[begin,end]} (offsets relative
// to the data buffer) and holds string metadata under "__metadata__".
// Encode lays tensors out sorted by name and stores a SHA-256 digest of the
// header entries, the metadata and the data buffer under ChecksumKey.
//
// Decode treats its input as hostile: it bounds the header size, checks
// every offset and shape before allocating, rejects duplicate names and
// verifies the checksum when one is present. Files written by other
// safetensors writers (without the checksum) load with Verified == false.
package checkpoint

import (
	"bytes"
	"cmp"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash"
	"io"
	"math"
	"slices"
	"unicode/utf8"

	"github.com/skyhive/skyhive/tensor"
)

// ChecksumKey is the __metadata__ key under which Encode stores the
// lowercase hex SHA-256 digest described in docs/checkpoint.md.
const ChecksumKey = "skyhive.sha256"

// MaxHeaderBytes bounds the JSON header that Decode accepts.
const MaxHeaderBytes = 100 << 20

// metadataKey is the reserved safetensors header key for string metadata.
const metadataKey = "__metadata__"

// maxRank bounds the number of dimensions of a tensor.
const maxRank = 32

// checksumDomain starts every digest so it cannot collide with other uses.
const checksumDomain = "skyhive-checkpoint-v1\n"

// Errors wrapped by Decode and Load, for errors.Is.
var (
	// ErrFormat reports a malformed or unsupported file.
	ErrFormat = errors.New("malformed checkpoint")
	// ErrTruncated reports input that ends before the data it announces.
	ErrTruncated = errors.New("truncated checkpoint")
	// ErrChecksum reports a digest that does not match the contents.
	ErrChecksum = errors.New("checkpoint checksum mismatch")
)

// File is a decoded checkpoint.
type File struct {
	// Tensors maps names to tensors.
	Tensors map[string]*tensor.Tensor
	// Meta holds the string metadata, without ChecksumKey.
	Meta map[string]string
	// Verified reports whether the file carried a checksum and it matched.
	// Files from other safetensors writers have none and are unverified.
	Verified bool
}

// entry is one tensor's header record.
type entry struct {
	name        string
	dtype       string
	shape       []int
	begin, end  uint64
	numElements int
}

// headerEntry is the JSON form of an entry.
type headerEntry struct {
	Dtype       string   `json:"dtype"`
	Shape       []int    `json:"shape"`
	DataOffsets []uint64 `json:"data_offsets"`
}

// Encode writes tensors and meta to w in the safetensors format, with the
// tensors sorted by name and a checksum under ChecksumKey. Names must be
// non-empty valid UTF-8 other than "__metadata__"; meta must not use
// ChecksumKey. Nothing is written if the input is invalid.
func Encode(w io.Writer, tensors map[string]*tensor.Tensor, meta map[string]string) error {
	names := make([]string, 0, len(tensors))
	for name, t := range tensors {
		if err := checkTensor(name, t); err != nil {
			return fmt.Errorf("checkpoint: encode: %w", err)
		}
		names = append(names, name)
	}
	slices.Sort(names)
	for k, v := range meta {
		if k == ChecksumKey {
			return fmt.Errorf("checkpoint: encode: metadata key %q is reserved", k)
		}
		if !utf8.ValidString(k) || !utf8.ValidString(v) {
			return fmt.Errorf("checkpoint: encode: metadata %q is not valid UTF-8", k)
		}
	}

	entries := make([]entry, len(names))
	var off uint64
	for i, name := range names {
		t := tensors[name]
		n := uint64(len(t.Data)) * 4
		entries[i] = entry{name: name, dtype: "F32", shape: t.Shape, begin: off, end: off + n, numElements: len(t.Data)}
		off += n
	}

	h := sha256.New()
	hashHeader(h, entries, meta)
	var chunk [4096]byte
	for _, e := range entries {
		data := tensors[e.name].Data
		for len(data) > 0 {
			k := putFloats(chunk[:], data)
			h.Write(chunk[:4*k])
			data = data[k:]
		}
	}

	header := make(map[string]any, len(entries)+1)
	for _, e := range entries {
		header[e.name] = headerEntry{Dtype: e.dtype, Shape: nonNil(e.shape), DataOffsets: []uint64{e.begin, e.end}}
	}
	fullMeta := make(map[string]string, len(meta)+1)
	for k, v := range meta {
		fullMeta[k] = v
	}
	fullMeta[ChecksumKey] = hex.EncodeToString(h.Sum(nil))
	header[metadataKey] = fullMeta

	var hb bytes.Buffer
	hb.Write(make([]byte, 8))
	enc := json.NewEncoder(&hb)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(header); err != nil {
		return fmt.Errorf("checkpoint: encode header: %w", err)
	}
	hb.Truncate(hb.Len() - 1) // the encoder's trailing newline
	for hb.Len()%8 != 0 {     // pad with spaces to align the data, as safetensors does
		hb.WriteByte(' ')
	}
	if hb.Len()-8 > MaxHeaderBytes {
		return fmt.Errorf("checkpoint: encode: header of %d bytes exceeds the limit of %d", hb.Len()-8, MaxHeaderBytes)
	}
	hdr := hb.Bytes()
	binary.LittleEndian.PutUint64(hdr, uint64(len(hdr)-8))
	if _, err := w.Write(hdr); err != nil {
		return fmt.Errorf("checkpoint: write header: %w", err)
	}

	buf := make([]byte, 1<<16)
	for _, e := range entries {
		data := tensors[e.name].Data
		for len(data) > 0 {
			k := putFloats(buf, data)
			if _, err := w.Write(buf[:4*k]); err != nil {
				return fmt.Errorf("checkpoint: write tensor %q: %w", e.name, err)
			}
			data = data[k:]
		}
	}
	return nil
}

// checkTensor validates a tensor handed to Encode.
func checkTensor(name string, t *tensor.Tensor) error {
	switch {
	case name == "" || name == metadataKey:
		return fmt.Errorf("invalid tensor name %q", name)
	case !utf8.ValidString(name):
		return fmt.Errorf("tensor name %q is not valid UTF-8", name)
	case t == nil:
		return fmt.Errorf("tensor %q is nil", name)
	case len(t.Shape) > maxRank:
		return fmt.Errorf("tensor %q has rank %d, more than %d", name, len(t.Shape), maxRank)
	}
	n := 1
	for _, d := range t.Shape {
		if d < 0 {
			return fmt.Errorf("tensor %q has negative dimension in shape %v", name, t.Shape)
		}
		if d != 0 && n > math.MaxInt/4/d {
			return fmt.Errorf("tensor %q: shape %v is too large", name, t.Shape)
		}
		n *= d
	}
	if n != len(t.Data) {
		return fmt.Errorf("tensor %q: shape %v needs %d elements, has %d", name, t.Shape, n, len(t.Data))
	}
	return nil
}

// nonNil makes a nil shape encode as [] rather than null.
func nonNil(s []int) []int {
	if s == nil {
		return []int{}
	}
	return s
}

// putFloats writes as many little-endian float32s from src into dst as fit
// and returns how many it wrote.
func putFloats(dst []byte, src []float32) int {
	k := min(len(dst)/4, len(src))
	for i, v := range src[:k] {
		binary.LittleEndian.PutUint32(dst[4*i:], math.Float32bits(v))
	}
	return k
}

// hashHeader feeds the canonical form of the entries (sorted by name) and of
// the metadata (sorted by key, without ChecksumKey) to h.
func hashHeader(h hash.Hash, entries []entry, meta map[string]string) {
	var b [8]byte
	u64 := func(v uint64) {
		binary.LittleEndian.PutUint64(b[:], v)
		h.Write(b[:])
	}
	str := func(s string) {
		u64(uint64(len(s)))
		io.WriteString(h, s)
	}
	sorted := slices.Clone(entries)
	slices.SortFunc(sorted, func(a, b entry) int { return cmp.Compare(a.name, b.name) })
	io.WriteString(h, checksumDomain)
	u64(uint64(len(sorted)))
	for _, e := range sorted {
		str(e.name)
		str(e.dtype)
		u64(uint64(len(e.shape)))
		for _, d := range e.shape {
			u64(uint64(d))
		}
		u64(e.begin)
		u64(e.end)
	}
	keys := make([]string, 0, len(meta))
	for k := range meta {
		if k != ChecksumKey {
			keys = append(keys, k)
		}
	}
	slices.Sort(keys)
	u64(uint64(len(keys)))
	for _, k := range keys {
		str(k)
		str(meta[k])
	}
}
