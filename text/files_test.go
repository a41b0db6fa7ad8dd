package text

import (
	"bytes"
	"encoding/binary"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

func TestTokenFileRoundTrip(t *testing.T) {
	tokens := []int32{0, 1, 50256, 65535, 7, 300}
	for _, width := range []int{2, 4} {
		path := filepath.Join(t.TempDir(), "train.bin")
		if err := WriteTokenFile(path, tokens, width); err != nil {
			t.Fatal(err)
		}
		st, err := os.Stat(path)
		if err != nil {
			t.Fatal(err)
		}
		if st.Size() != int64(len(tokens)*width) {
			t.Fatalf("width %d: file size %d, want %d", width, st.Size(), len(tokens)*width)
		}
		got, err := ReadTokenFile(path, width, 65536)
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(got, tokens) {
			t.Errorf("width %d: read %v, want %v", width, got, tokens)
		}
	}
}

func TestTokenFileLayout(t *testing.T) {
	// nanoGPT writes np.uint16 arrays with tofile: little-endian, no header.
	got, err := DecodeTokens([]byte{0x01, 0x00, 0x4b, 0xc4}, 2, 50257)
	if err != nil || !slices.Equal(got, []int32{1, 50251}) {
		t.Fatalf("DecodeTokens = %v, %v; want [1 50251]", got, err)
	}
}

func TestTokenFileOutOfVocab(t *testing.T) {
	tokens := make([]int32, 20)
	tokens[12] = 70000
	path := filepath.Join(t.TempDir(), "bad.bin")
	if err := WriteTokenFile(path, tokens, 4); err != nil {
		t.Fatal(err)
	}
	_, err := ReadTokenFile(path, 4, 50257)
	if !errors.Is(err, ErrFormat) || !strings.Contains(err.Error(), "token id 70000 at position 12 exceeds the vocabulary of 50257") {
		t.Fatalf("err = %v, want the offending id and position", err)
	}
}

func TestTokenFileErrors(t *testing.T) {
	dir := t.TempDir()
	write := func(name string, b []byte) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, b, 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	if _, err := ReadTokenFile(write("empty.bin", nil), 2, 100); !errors.Is(err, ErrEmpty) {
		t.Errorf("empty file: err = %v, want ErrEmpty", err)
	}
	if _, err := ReadTokenFile(write("odd.bin", []byte{1, 0, 2}), 2, 100); !errors.Is(err, ErrFormat) {
		t.Errorf("odd size: err = %v, want ErrFormat", err)
	}
	if _, err := ReadTokenFile(write("ok.bin", []byte{1, 0}), 3, 100); err == nil {
		t.Error("width 3 accepted")
	}
	if _, err := ReadTokenFile(write("ok2.bin", []byte{1, 0}), 2, 1<<17); err == nil {
		t.Error("a vocabulary that does not fit uint16 accepted for width 2")
	}
	if _, err := ReadTokenFile(filepath.Join(dir, "absent.bin"), 2, 100); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("absent file: err = %v", err)
	}
	if _, err := EncodeTokens([]int32{70000}, 2); err == nil {
		t.Error("id 70000 encoded in 2 bytes")
	}
}

func TestReadTextFile(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "corpus.txt")
	text := []byte("It was the best of times,\nit was the worst of times.\n")
	if err := os.WriteFile(path, text, 0o644); err != nil {
		t.Fatal(err)
	}
	got, err := ReadTextFile(path, 0)
	if err != nil || !bytes.Equal(got, text) {
		t.Fatalf("ReadTextFile = %q, %v", got, err)
	}
	got, err = ReadTextFile(path, 10)
	if err != nil || !bytes.Equal(got, text[:10]) {
		t.Fatalf("ReadTextFile(10) = %q, %v; want the first 10 bytes", got, err)
	}
	empty := filepath.Join(dir, "empty.txt")
	if err := os.WriteFile(empty, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := ReadTextFile(empty, 0); !errors.Is(err, ErrEmpty) {
		t.Errorf("empty text file: err = %v, want ErrEmpty", err)
	}
}

func FuzzDecodeTokens(f *testing.F) {
	f.Add([]byte{1, 0, 2, 0}, uint8(2), uint32(3))
	f.Add([]byte{0xff, 0xff, 0xff, 0xff}, uint8(4), uint32(50257))
	f.Add([]byte{}, uint8(2), uint32(1))
	f.Add([]byte{1, 2, 3}, uint8(2), uint32(1000))
	f.Fuzz(func(t *testing.T, b []byte, w uint8, vocab uint32) {
		width := 2 + 2*int(w%2)
		got, err := DecodeTokens(b, width, int(vocab))
		if err != nil {
			return
		}
		if len(got) != len(b)/width || len(b)%width != 0 || len(got) == 0 {
			t.Fatalf("%d bytes of width %d decoded to %d tokens", len(b), width, len(got))
		}
		for i, id := range got {
			var raw uint32
			if width == 2 {
				raw = uint32(binary.LittleEndian.Uint16(b[2*i:]))
			} else {
				raw = binary.LittleEndian.Uint32(b[4*i:])
			}
			if id < 0 || int64(id) >= int64(vocab) || uint32(id) != raw {
				t.Fatalf("token %d = %d (raw %d) with vocabulary %d", i, id, raw, vocab)
			}
		}
		enc, err := EncodeTokens(got, width)
		if err != nil || !bytes.Equal(enc, b) {
			t.Fatalf("re-encoding gave %x, %v; want %x", enc, err, b)
		}
	})
}
