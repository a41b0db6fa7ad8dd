package text

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
)

// ErrEmpty is wrapped by the errors that report a corpus with no text or no
// tokens.
var ErrEmpty = errors.New("empty corpus")

// ErrFormat is wrapped by the errors that report malformed token data or a
// malformed tokenizer.
var ErrFormat = errors.New("malformed data")

// MaxVocab is the largest vocabulary the package handles: token ids must be
// exact in float32 (as nn.Embedding takes them) and fit a uint32 file.
const MaxVocab = 1 << 24

// MaxTokens bounds the number of tokens ReadTokenFile and DecodeTokens
// accept (1 GiB of int32 ids in memory).
const MaxTokens = 1 << 28

// ReadTextFile returns the first maxBytes bytes of the file at path
// (DefaultMaxBytes when maxBytes <= 0) as the training text. The bytes are
// returned as they are: byte-level BPE handles any encoding. An empty file
// is an error wrapping ErrEmpty.
func ReadTextFile(path string, maxBytes int64) ([]byte, error) {
	if maxBytes <= 0 {
		maxBytes = DefaultMaxBytes
	}
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("text: %w", err)
	}
	defer f.Close()
	size := maxBytes
	if st, err := f.Stat(); err == nil && st.Mode().IsRegular() {
		size = min(size, st.Size())
	}
	// Read at most maxBytes; the initial buffer follows the file size, and
	// io.ReadAll grows it if the file grew, never past the limit.
	buf := make([]byte, 0, size+1)
	buf, err = readAllInto(buf, io.LimitReader(f, maxBytes))
	if err != nil {
		return nil, fmt.Errorf("text: reading %s: %w", path, err)
	}
	if len(buf) == 0 {
		return nil, fmt.Errorf("text: %s: %w: the file holds no text", path, ErrEmpty)
	}
	return buf, nil
}

// readAllInto appends everything r yields to buf.
func readAllInto(buf []byte, r io.Reader) ([]byte, error) {
	for {
		if len(buf) == cap(buf) {
			buf = append(buf, 0)[:len(buf)]
		}
		n, err := r.Read(buf[len(buf):cap(buf)])
		buf = buf[:len(buf)+n]
		if err == io.EOF {
			return buf, nil
		}
		if err != nil {
			return nil, err
		}
	}
}

// ReadTokenFile reads a pre-tokenized corpus as nanoGPT-style pipelines
// write it: a flat array of little-endian unsigned token ids, width bytes
// each (2 for uint16, 4 for uint32), with no header. Every id must be below
// vocab; the error for one that is not names its position. A file whose
// size is not a multiple of width, one with more than MaxTokens tokens, or
// an empty one is an error.
func ReadTokenFile(path string, width, vocab int) ([]int32, error) {
	if err := checkTokenParams(width, vocab); err != nil {
		return nil, err
	}
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("text: %w", err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("text: %w", err)
	}
	if !st.Mode().IsRegular() {
		return nil, fmt.Errorf("text: token file %s is not a regular file", path)
	}
	size := st.Size()
	if size > int64(MaxTokens)*int64(width) {
		return nil, fmt.Errorf("text: token file %s: %w: %d bytes hold more than the limit of %d tokens", path, ErrFormat, size, MaxTokens)
	}
	buf := make([]byte, size)
	if _, err := io.ReadFull(f, buf); err != nil {
		return nil, fmt.Errorf("text: reading token file %s: %w", path, err)
	}
	tokens, err := DecodeTokens(buf, width, vocab)
	if err != nil {
		return nil, fmt.Errorf("text: token file %s: %w", path, err)
	}
	return tokens, nil
}

// DecodeTokens decodes a flat little-endian array of width-byte token ids
// (the body of a token file) and checks each against vocab.
func DecodeTokens(b []byte, width, vocab int) ([]int32, error) {
	if err := checkTokenParams(width, vocab); err != nil {
		return nil, err
	}
	if len(b) == 0 {
		return nil, fmt.Errorf("%w: no tokens", ErrEmpty)
	}
	if len(b)%width != 0 {
		return nil, fmt.Errorf("%w: %d bytes is not a whole number of %d-byte token ids", ErrFormat, len(b), width)
	}
	n := len(b) / width
	if n > MaxTokens {
		return nil, fmt.Errorf("%w: %d tokens exceed the limit of %d", ErrFormat, n, MaxTokens)
	}
	tokens := make([]int32, n)
	for i := range tokens {
		var id uint32
		if width == 2 {
			id = uint32(binary.LittleEndian.Uint16(b[2*i:]))
		} else {
			id = binary.LittleEndian.Uint32(b[4*i:])
		}
		if id >= uint32(vocab) {
			return nil, fmt.Errorf("%w: token id %d at position %d exceeds the vocabulary of %d", ErrFormat, id, i, vocab)
		}
		tokens[i] = int32(id)
	}
	return tokens, nil
}

// EncodeTokens returns tokens as a flat little-endian array of width-byte
// ids, the format ReadTokenFile reads. Every id must fit the width.
func EncodeTokens(tokens []int32, width int) ([]byte, error) {
	if width != 2 && width != 4 {
		return nil, fmt.Errorf("text: token width %d: want 2 (uint16) or 4 (uint32) bytes", width)
	}
	b := make([]byte, len(tokens)*width)
	for i, t := range tokens {
		if t < 0 || width == 2 && t > 0xffff {
			return nil, fmt.Errorf("text: token id %d at position %d does not fit %d bytes", t, i, width)
		}
		if width == 2 {
			binary.LittleEndian.PutUint16(b[2*i:], uint16(t))
		} else {
			binary.LittleEndian.PutUint32(b[4*i:], uint32(t))
		}
	}
	return b, nil
}

// WriteTokenFile writes tokens to path in the format ReadTokenFile reads.
func WriteTokenFile(path string, tokens []int32, width int) error {
	b, err := EncodeTokens(tokens, width)
	if err != nil {
		return err
	}
	return writeFileAtomic(path, b)
}

// checkTokenParams validates a token width and vocabulary size.
func checkTokenParams(width, vocab int) error {
	if width != 2 && width != 4 {
		return fmt.Errorf("text: token width %d: want 2 (uint16) or 4 (uint32) bytes", width)
	}
	if vocab < 1 || vocab > MaxVocab {
		return fmt.Errorf("text: vocabulary size %d outside [1, %d]", vocab, MaxVocab)
	}
	if width == 2 && vocab > 1<<16 {
		return fmt.Errorf("text: a vocabulary of %d does not fit 2-byte token ids; use width 4", vocab)
	}
	return nil
}

// writeFileAtomic writes b to a temporary file beside path and renames it
// into place, so readers never see a partial file.
func writeFileAtomic(path string, b []byte) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".tmp*")
	if err != nil {
		return fmt.Errorf("text: %w", err)
	}
	_, werr := tmp.Write(b)
	cerr := tmp.Close()
	if err := errors.Join(werr, cerr); err != nil {
		os.Remove(tmp.Name())
		return fmt.Errorf("text: writing %s: %w", path, err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		os.Remove(tmp.Name())
		return fmt.Errorf("text: %w", err)
	}
	return nil
}
