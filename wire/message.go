package wire

import (
	"encoding/binary"
	"fmt"
	"io"
	"unicode/utf8"

	"github.com/skyhive/skyhive/tensor"
)

// MaxNameLen is the longest tensor name a message can carry, in bytes.
const MaxNameLen = 255

// Named is a tensor with a name, one entry of a message (for example the
// several inputs of an expert's forward call).
type Named struct {
	Name   string
	Tensor *tensor.Tensor
}

// Get returns the tensor called name in msg, or nil.
func Get(msg []Named, name string) *tensor.Tensor {
	for _, e := range msg {
		if e.Name == name {
			return e.Tensor
		}
	}
	return nil
}

func checkMessage(msg []Named) error {
	if len(msg) > 0xffff {
		return fmt.Errorf("%w: %d tensors in one message", ErrLimit, len(msg))
	}
	seen := make(map[string]bool, len(msg))
	for _, e := range msg {
		if len(e.Name) > MaxNameLen || !utf8.ValidString(e.Name) {
			return fmt.Errorf("%w: tensor name %.40q", ErrFormat, e.Name)
		}
		if seen[e.Name] {
			return fmt.Errorf("%w: duplicate tensor name %q", ErrFormat, e.Name)
		}
		seen[e.Name] = true
	}
	return nil
}

// EncodeMessage writes the named tensors to w, each encoded with o. Names
// must be distinct valid UTF-8 of at most MaxNameLen bytes.
func EncodeMessage(w io.Writer, msg []Named, o Options) error {
	if err := checkMessage(msg); err != nil {
		return err
	}
	hdr := []byte{messageMagic[0], messageMagic[1], messageMagic[2], version, 0, 0}
	binary.LittleEndian.PutUint16(hdr[4:], uint16(len(msg)))
	if _, err := w.Write(hdr); err != nil {
		return fmt.Errorf("wire: encode message: %w", err)
	}
	for _, e := range msg {
		name := append([]byte{byte(len(e.Name))}, e.Name...)
		if _, err := w.Write(name); err != nil {
			return fmt.Errorf("wire: encode message: %w", err)
		}
		if err := Encode(w, e.Tensor, o); err != nil {
			return fmt.Errorf("wire: tensor %q: %w", e.Name, err)
		}
	}
	return nil
}

// MessageSize returns the number of bytes EncodeMessage writes for msg.
func MessageSize(msg []Named, o Options) int {
	size := 6
	for _, e := range msg {
		if e.Tensor != nil {
			size += 1 + len(e.Name) + EncodedSize(e.Tensor, o)
		}
	}
	return size
}

// MarshalMessage returns the encoding of the named tensors.
func MarshalMessage(msg []Named, o Options) ([]byte, error) {
	w := &sliceWriter{b: make([]byte, 0, MessageSize(msg, o))}
	if err := EncodeMessage(w, msg, o); err != nil {
		return nil, err
	}
	return w.b, nil
}

// DecodeMessage reads a message of named tensors from r, reading exactly
// its encoding. lim.MaxElements bounds the total over all tensors.
func DecodeMessage(r io.Reader, lim Limits) ([]Named, error) {
	lim = lim.withDefaults()
	var hdr [6]byte
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		return nil, fmt.Errorf("wire: read message header: %w", eofIsUnexpected(err))
	}
	if [3]byte(hdr[:3]) != messageMagic || hdr[3] != version {
		return nil, fmt.Errorf("%w: bad message header %x", ErrFormat, hdr[:4])
	}
	count := int(binary.LittleEndian.Uint16(hdr[4:]))
	if count > lim.MaxTensors {
		return nil, fmt.Errorf("%w: %d tensors > %d", ErrLimit, count, lim.MaxTensors)
	}
	msg := make([]Named, 0, count)
	budget := lim.MaxElements
	seen := make(map[string]bool, count)
	var name [MaxNameLen]byte
	for range count {
		var l [1]byte
		if _, err := io.ReadFull(r, l[:]); err != nil {
			return nil, fmt.Errorf("wire: read name: %w", eofIsUnexpected(err))
		}
		if _, err := io.ReadFull(r, name[:l[0]]); err != nil {
			return nil, fmt.Errorf("wire: read name: %w", eofIsUnexpected(err))
		}
		s := string(name[:l[0]])
		if !utf8.ValidString(s) {
			return nil, fmt.Errorf("%w: tensor name is not UTF-8", ErrFormat)
		}
		if seen[s] {
			return nil, fmt.Errorf("%w: duplicate tensor name %q", ErrFormat, s)
		}
		t, err := decode(r, lim, budget)
		if err != nil {
			return nil, fmt.Errorf("wire: tensor %q: %w", s, err)
		}
		seen[s] = true
		budget -= len(t.Data)
		msg = append(msg, Named{Name: s, Tensor: t})
	}
	return msg, nil
}

// UnmarshalMessage decodes a message from b, which must hold exactly one.
func UnmarshalMessage(b []byte, lim Limits) ([]Named, error) {
	r := &sliceReader{b: b}
	msg, err := DecodeMessage(r, lim)
	if err != nil {
		return nil, err
	}
	if len(r.b) != 0 {
		return nil, fmt.Errorf("%w: %d trailing bytes", ErrFormat, len(r.b))
	}
	return msg, nil
}
