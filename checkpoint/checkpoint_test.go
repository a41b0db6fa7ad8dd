package checkpoint

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"maps"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/skyhive/skyhive/tensor"
)

func sampleTensors() map[string]*tensor.Tensor {
	w := tensor.New(3, 4)
	for i := range w.Data {
		w.Data[i] = float32(i)*0.5 - 1
	}
	return map[string]*tensor.Tensor{
		"layer.0.weight": w,
		"layer.0.bias":   tensor.FromSlice([]float32{float32(math.Inf(1)), -0, 1e-30}, 3),
		"scalar":         tensor.FromSlice([]float32{42}),
		"empty":          tensor.New(0, 5),
		"zz.last":        tensor.FromSlice([]float32{float32(math.NaN()), 7}, 1, 2),
	}
}

func sampleMeta() map[string]string {
	return map[string]string{"step": "1200", "optimizer": "adamw", "note": "<&> ünïcode"}
}

func encodeBytes(t testing.TB, tensors map[string]*tensor.Tensor, meta map[string]string) []byte {
	t.Helper()
	var b bytes.Buffer
	if err := Encode(&b, tensors, meta); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

// sameTensors compares bit patterns, so NaN and -0 count as equal to themselves.
func sameTensors(a, b map[string]*tensor.Tensor) error {
	if len(a) != len(b) {
		return fmt.Errorf("%d tensors vs %d", len(a), len(b))
	}
	for name, x := range a {
		y, ok := b[name]
		if !ok {
			return fmt.Errorf("tensor %q missing", name)
		}
		if !slices.Equal(x.Shape, y.Shape) && !(len(x.Shape) == 0 && len(y.Shape) == 0) {
			return fmt.Errorf("tensor %q: shape %v vs %v", name, x.Shape, y.Shape)
		}
		if len(x.Data) != len(y.Data) {
			return fmt.Errorf("tensor %q: %d vs %d elements", name, len(x.Data), len(y.Data))
		}
		for i := range x.Data {
			if math.Float32bits(x.Data[i]) != math.Float32bits(y.Data[i]) {
				return fmt.Errorf("tensor %q[%d]: %v vs %v", name, i, x.Data[i], y.Data[i])
			}
		}
	}
	return nil
}

func TestRoundTrip(t *testing.T) {
	path := filepath.Join(t.TempDir(), "model.safetensors")
	in, meta := sampleTensors(), sampleMeta()
	if err := Save(path, in, meta); err != nil {
		t.Fatal(err)
	}
	f, err := Load(path)
	if err != nil {
		t.Fatal(err)
	}
	if !f.Verified {
		t.Error("own checkpoint not verified")
	}
	if err := sameTensors(in, f.Tensors); err != nil {
		t.Error(err)
	}
	if !maps.Equal(f.Meta, meta) {
		t.Errorf("meta %v, want %v", f.Meta, meta)
	}
	if st, _ := os.Stat(path); st.Mode().Perm() != 0o644 {
		t.Errorf("mode %v", st.Mode())
	}

	// Encoding is deterministic, the header is 8-byte aligned and the
	// tensors are laid out sorted by name.
	b1, b2 := encodeBytes(t, in, meta), encodeBytes(t, in, meta)
	if !bytes.Equal(b1, b2) {
		t.Error("encoding is not deterministic")
	}
	hlen := binary.LittleEndian.Uint64(b1)
	if hlen%8 != 0 {
		t.Errorf("header length %d not aligned", hlen)
	}
	data := b1[8+hlen:]
	// Layout by name: empty (0 bytes), layer.0.bias (12), layer.0.weight.
	if v := math.Float32frombits(binary.LittleEndian.Uint32(data[12:])); v != -1 {
		t.Errorf("layer.0.weight should start at byte 12 of the data buffer, found %v", v)
	}

	// Empty checkpoints work too.
	e, err := Decode(bytes.NewReader(encodeBytes(t, nil, nil)), 1<<10)
	if err != nil || len(e.Tensors) != 0 || len(e.Meta) != 0 || !e.Verified {
		t.Errorf("empty checkpoint: %+v, %v", e, err)
	}
}

func TestEncodeRejects(t *testing.T) {
	good := tensor.New(2)
	cases := map[string]struct {
		tensors map[string]*tensor.Tensor
		meta    map[string]string
	}{
		"reserved meta":  {map[string]*tensor.Tensor{"a": good}, map[string]string{ChecksumKey: "x"}},
		"metadata name":  {map[string]*tensor.Tensor{"__metadata__": good}, nil},
		"empty name":     {map[string]*tensor.Tensor{"": good}, nil},
		"nil tensor":     {map[string]*tensor.Tensor{"a": nil}, nil},
		"shape mismatch": {map[string]*tensor.Tensor{"a": {Shape: []int{3}, Data: make([]float32, 2)}}, nil},
		"negative dim":   {map[string]*tensor.Tensor{"a": {Shape: []int{-1, -2}, Data: make([]float32, 2)}}, nil},
		"bad utf8 name":  {map[string]*tensor.Tensor{"a\xff": good}, nil},
		"bad utf8 meta":  {nil, map[string]string{"k": "\xfe"}},
	}
	for name, c := range cases {
		var b bytes.Buffer
		if err := Encode(&b, c.tensors, c.meta); err == nil {
			t.Errorf("%s: accepted", name)
		} else if b.Len() != 0 {
			t.Errorf("%s: wrote %d bytes before failing", name, b.Len())
		}
	}
}

// TestEveryByteFlipDetected corrupts each byte of an encoding in turn.
func TestEveryByteFlipDetected(t *testing.T) {
	enc := encodeBytes(t, sampleTensors(), sampleMeta())
	for i := range enc {
		bad := bytes.Clone(enc)
		bad[i] ^= 0xff
		if _, err := Decode(bytes.NewReader(bad), int64(len(bad))); err == nil {
			t.Fatalf("flipping byte %d of %d went unnoticed", i, len(enc))
		}
	}
	// A single-bit flip in the data buffer is a checksum error.
	bad := bytes.Clone(enc)
	bad[len(bad)-3] ^= 1
	if _, err := Decode(bytes.NewReader(bad), int64(len(bad))); !errors.Is(err, ErrChecksum) {
		t.Errorf("data bit flip: %v, want ErrChecksum", err)
	}
	// So is a consistent but altered header: rename a tensor.
	bad = bytes.Replace(enc, []byte(`"scalar"`), []byte(`"scalaR"`), 1)
	if _, err := Decode(bytes.NewReader(bad), int64(len(bad))); !errors.Is(err, ErrChecksum) {
		t.Errorf("renamed tensor: %v, want ErrChecksum", err)
	}
	bad = bytes.Replace(enc, []byte(`"1200"`), []byte(`"1201"`), 1)
	if _, err := Decode(bytes.NewReader(bad), int64(len(bad))); !errors.Is(err, ErrChecksum) {
		t.Errorf("altered metadata: %v, want ErrChecksum", err)
	}
	// Damage to the checksum key itself leaves a file without checksum:
	// it still loads, but callers can tell from Verified.
	bad = bytes.Replace(enc, []byte(ChecksumKey), []byte("skyhive.sha255"), 1)
	if f, err := Decode(bytes.NewReader(bad), int64(len(bad))); err != nil || f.Verified {
		t.Errorf("renamed checksum key: verified=%v, %v", f != nil && f.Verified, err)
	}
}

func TestCorruptFileNamesPath(t *testing.T) {
	path := filepath.Join(t.TempDir(), "ckpt.safetensors")
	if err := Save(path, sampleTensors(), sampleMeta()); err != nil {
		t.Fatal(err)
	}
	raw, _ := os.ReadFile(path)
	raw[len(raw)-1] ^= 0x40
	os.WriteFile(path, raw, 0o644)
	_, err := Load(path)
	if !errors.Is(err, ErrChecksum) || !strings.Contains(err.Error(), path) || !strings.Contains(err.Error(), "corrupt") {
		t.Errorf("error %v should wrap ErrChecksum, name %s and say it is corrupt", err, path)
	}

	raw[len(raw)-1] ^= 0x40
	os.WriteFile(path, append(raw, 0), 0o644)
	if _, err := Load(path); !errors.Is(err, ErrFormat) || !strings.Contains(err.Error(), "1 bytes after") {
		t.Errorf("trailing byte: %v", err)
	}
	if _, err := Load(filepath.Join(t.TempDir(), "missing")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("missing file: %v", err)
	}
}

// TestTruncationDetected loads every proper prefix of a checkpoint file.
func TestTruncationDetected(t *testing.T) {
	dir := t.TempDir()
	enc := encodeBytes(t, sampleTensors(), sampleMeta())
	path := filepath.Join(dir, "cut.safetensors")
	for n := range len(enc) {
		if err := os.WriteFile(path, enc[:n], 0o644); err != nil {
			t.Fatal(err)
		}
		_, err := Load(path)
		if !errors.Is(err, ErrTruncated) || !strings.Contains(err.Error(), path) {
			t.Fatalf("prefix of %d/%d bytes: %v", n, len(enc), err)
		}
		// A stream with a generous limit notices the early end as well.
		if _, err := Decode(bytes.NewReader(enc[:n]), 1<<20); !errors.Is(err, ErrTruncated) {
			t.Fatalf("stream prefix of %d/%d bytes: %v", n, len(enc), err)
		}
	}
}

func TestDecodeStreamAndLimit(t *testing.T) {
	a := encodeBytes(t, sampleTensors(), nil)
	b := encodeBytes(t, map[string]*tensor.Tensor{"x": tensor.FromSlice([]float32{3}, 1)}, map[string]string{"k": "v"})
	r := bytes.NewReader(append(bytes.Clone(a), b...))
	fa, err := Decode(r, 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	fb, err := Decode(r, 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	if r.Len() != 0 || len(fa.Tensors) != 5 || fb.Tensors["x"].Data[0] != 3 || fb.Meta["k"] != "v" {
		t.Errorf("stream decode: %d bytes left, %v, %v", r.Len(), fa.Tensors, fb)
	}
	if _, err := Decode(bytes.NewReader(a), int64(len(a)-1)); err == nil {
		t.Error("encoding larger than maxBytes accepted")
	}
	if _, err := Decode(bytes.NewReader(a), int64(len(a))); err != nil {
		t.Errorf("encoding of exactly maxBytes rejected: %v", err)
	}
}

// handMade builds a safetensors file byte by byte as the specification
// describes, the way another writer (for example Python's safetensors)
// would: no checksum, tensors not in name order, header padded with spaces.
func handMade(header string, data []byte) []byte {
	for (len(header))%8 != 0 {
		header += " "
	}
	out := binary.LittleEndian.AppendUint64(nil, uint64(len(header)))
	out = append(out, header...)
	return append(out, data...)
}

func TestInteropHandMade(t *testing.T) {
	header := `{"__metadata__":{"format":"pt"},` +
		`"weight":{"dtype":"F32","shape":[2,2],"data_offsets":[4,20]},` +
		`"bias":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}`
	data := []byte{
		0x00, 0x00, 0x00, 0xbf, // bias: -0.5
		0x00, 0x00, 0x80, 0x3f, // 1.0
		0x00, 0x00, 0x00, 0x40, // 2.0
		0x00, 0x00, 0x40, 0x40, // 3.0
		0x00, 0x00, 0x80, 0xc0, // -4.0
	}
	path := filepath.Join(t.TempDir(), "foreign.safetensors")
	if err := os.WriteFile(path, handMade(header, data), 0o644); err != nil {
		t.Fatal(err)
	}
	f, err := Load(path)
	if err != nil {
		t.Fatal(err)
	}
	if f.Verified {
		t.Error("a file without checksum reported as verified")
	}
	want := map[string]*tensor.Tensor{
		"weight": tensor.FromSlice([]float32{1, 2, 3, -4}, 2, 2),
		"bias":   tensor.FromSlice([]float32{-0.5}, 1),
	}
	if err := sameTensors(want, f.Tensors); err != nil {
		t.Error(err)
	}
	if !maps.Equal(f.Meta, map[string]string{"format": "pt"}) {
		t.Errorf("meta %v", f.Meta)
	}

	// Our own files parse as plain safetensors: the JSON header alone
	// describes every tensor.
	enc := encodeBytes(t, want, nil)
	hdr := string(enc[8 : 8+binary.LittleEndian.Uint64(enc)])
	for _, s := range []string{`"bias":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}`, `"weight":{"dtype":"F32","shape":[2,2],"data_offsets":[4,20]}`, `"__metadata__":{"` + ChecksumKey + `":"`} {
		if !strings.Contains(hdr, s) {
			t.Errorf("header %s lacks %s", hdr, s)
		}
	}
}

func TestDecodeRejectsBadHeaders(t *testing.T) {
	f32 := make([]byte, 8)
	cases := map[string][]byte{
		"not an object":      handMade(`[1,2]`, nil),
		"duplicate tensor":   handMade(`{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}}`, f32),
		"duplicate metadata": handMade(`{"__metadata__":{"k":"1","k":"2"}}`, nil),
		"two metadata":       handMade(`{"__metadata__":{},"__metadata__":{}}`, nil),
		"metadata number":    handMade(`{"__metadata__":{"k":1}}`, nil),
		"dtype F16":          handMade(`{"a":{"dtype":"F16","shape":[2],"data_offsets":[0,4]}}`, f32[:4]),
		"dtype F64":          handMade(`{"a":{"dtype":"F64","shape":[1],"data_offsets":[0,8]}}`, f32),
		"size mismatch":      handMade(`{"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}}`, f32),
		"overlap":            handMade(`{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}}`, f32),
		"gap":                handMade(`{"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}}`, f32),
		"reversed":           handMade(`{"a":{"dtype":"F32","shape":[0],"data_offsets":[8,4]}}`, f32),
		"negative dim":       handMade(`{"a":{"dtype":"F32","shape":[-1,-2],"data_offsets":[0,8]}}`, f32),
		"float dim":          handMade(`{"a":{"dtype":"F32","shape":[1.5],"data_offsets":[0,8]}}`, f32),
		"huge dims":          handMade(`{"a":{"dtype":"F32","shape":[4294967296,4294967296,4],"data_offsets":[0,8]}}`, f32),
		"three offsets":      handMade(`{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4,8]}}`, f32),
		"unknown field":      handMade(`{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4],"x":1}}`, f32[:4]),
		"trailing garbage":   handMade(`{}x`, nil),
		"bad checksum hex":   handMade(`{"__metadata__":{"skyhive.sha256":"zz"}}`, nil),
		"wrong checksum":     handMade(`{"__metadata__":{"skyhive.sha256":"`+strings.Repeat("ab", 32)+`"}}`, nil),
		"huge header length": binary.LittleEndian.AppendUint64(nil, 1<<62),
		"invalid utf8":       handMade("{\"__metadata__\":{\"k\":\"\xff\"}}", nil),
		"tiny header length": append(binary.LittleEndian.AppendUint64(nil, 1), '{'),
		"offsets past end":   handMade(`{"a":{"dtype":"F32","shape":[1048576],"data_offsets":[0,4194304]}}`, f32),
	}
	for name, in := range cases {
		_, err := Decode(bytes.NewReader(in), int64(len(in)))
		if err == nil {
			t.Errorf("%s: accepted", name)
			continue
		}
		if !errors.Is(err, ErrFormat) && !errors.Is(err, ErrTruncated) && !errors.Is(err, ErrChecksum) {
			t.Errorf("%s: %v wraps none of the sentinel errors", name, err)
		}
	}
	// Zero-sized tensors may share an offset; a scalar has shape [].
	ok := handMade(`{"e":{"dtype":"F32","shape":[0],"data_offsets":[0,0]},"f":{"dtype":"F32","shape":[3,0],"data_offsets":[0,0]},"s":{"dtype":"F32","shape":[],"data_offsets":[0,4]}}`, []byte{0, 0, 0x80, 0x3f})
	f, err := Decode(bytes.NewReader(ok), int64(len(ok)))
	if err != nil {
		t.Fatal(err)
	}
	if s := f.Tensors["s"]; len(s.Shape) != 0 || s.Data[0] != 1 || len(f.Tensors["f"].Data) != 0 {
		t.Errorf("decoded %v", f.Tensors)
	}
}

// failAfter is a writer that accepts n bytes and then fails.
type failAfter struct {
	w io.Writer
	n int
}

var errInjected = errors.New("injected write failure")

func (f *failAfter) Write(p []byte) (int, error) {
	if len(p) > f.n {
		m, _ := f.w.Write(p[:f.n])
		f.n = 0
		return m, errInjected
	}
	f.n -= len(p)
	return f.w.Write(p)
}

func listDir(t *testing.T, dir string) []string {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
	}
	return names
}

// TestCrashSafety makes saves fail midway and checks that the previous
// checkpoint survives and no temporary files remain.
func TestCrashSafety(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "ckpt.safetensors")
	old := sampleTensors()
	if err := Save(path, old, map[string]string{"step": "1"}); err != nil {
		t.Fatal(err)
	}
	newer := map[string]*tensor.Tensor{"w": tensor.New(1000, 100)}
	full := encodeBytes(t, newer, map[string]string{"step": "2"})

	check := func(what string) {
		t.Helper()
		f, err := Load(path)
		if err != nil {
			t.Fatalf("%s: old checkpoint damaged: %v", what, err)
		}
		if f.Meta["step"] != "1" || sameTensors(old, f.Tensors) != nil {
			t.Fatalf("%s: target changed", what)
		}
		if names := listDir(t, dir); !slices.Equal(names, []string{"ckpt.safetensors"}) {
			t.Fatalf("%s: directory holds %v", what, names)
		}
	}

	// The writer dies halfway through the new checkpoint.
	err := WriteAtomic(path, func(w io.Writer) error {
		return Encode(&failAfter{w: w, n: len(full) / 2}, newer, map[string]string{"step": "2"})
	})
	if !errors.Is(err, errInjected) || !strings.Contains(err.Error(), path) {
		t.Fatalf("err = %v", err)
	}
	check("failed write")

	// The producer panics after writing part of the data.
	func() {
		defer func() { recover() }()
		WriteAtomic(path, func(w io.Writer) error {
			w.Write(full[:len(full)/3])
			panic("crash")
		})
	}()
	check("panic")

	// Invalid input never reaches the disk.
	if err := Save(path, map[string]*tensor.Tensor{"bad": {Shape: []int{5}}}, nil); err == nil {
		t.Fatal("invalid tensor saved")
	}
	check("invalid tensor")

	// A missing directory is an error, not a stray file elsewhere.
	if err := Save(filepath.Join(dir, "no", "such", "dir"), old, nil); err == nil {
		t.Fatal("save into a missing directory succeeded")
	}
	check("missing directory")

	// Finally a successful save replaces the file.
	if err := Save(path, newer, map[string]string{"step": "2"}); err != nil {
		t.Fatal(err)
	}
	f, err := Load(path)
	if err != nil || f.Meta["step"] != "2" || len(f.Tensors["w"].Data) != 100000 {
		t.Fatalf("replacement: %v", err)
	}
	if names := listDir(t, dir); len(names) != 1 {
		t.Fatalf("directory holds %v", names)
	}
}

func FuzzDecode(f *testing.F) {
	f.Add(encodeBytes(f, sampleTensors(), sampleMeta()))
	f.Add(encodeBytes(f, map[string]*tensor.Tensor{"a": tensor.FromSlice([]float32{1, 2}, 2)}, nil))
	f.Add(encodeBytes(f, nil, nil))
	f.Add(handMade(`{"__metadata__":{"format":"pt"},"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}`, []byte{0, 0, 0x80, 0x3f}))
	f.Add(handMade(`{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"a":{"dtype":"F32","shape":[0],"data_offsets":[8,8]}}`, make([]byte, 8)))
	f.Add(handMade(`{"a":{"dtype":"F32","shape":[1073741824],"data_offsets":[0,4294967296]}}`, nil))
	f.Add(binary.LittleEndian.AppendUint64(nil, 1<<40))
	f.Fuzz(func(t *testing.T, in []byte) {
		file, err := Decode(bytes.NewReader(in), int64(len(in)))
		if err != nil {
			if !errors.Is(err, ErrFormat) && !errors.Is(err, ErrTruncated) && !errors.Is(err, ErrChecksum) {
				t.Fatalf("error %v wraps none of the sentinel errors", err)
			}
			return
		}
		var total int
		for _, x := range file.Tensors {
			if tensor.NumElements(x.Shape) != len(x.Data) {
				t.Fatalf("shape %v with %d elements", x.Shape, len(x.Data))
			}
			total += 4 * len(x.Data)
		}
		if total > len(in) {
			t.Fatalf("decoded %d data bytes from %d input bytes", total, len(in))
		}
		// What decodes must survive a round trip through Encode.
		var b bytes.Buffer
		if err := Encode(&b, file.Tensors, file.Meta); err != nil {
			// Decoded names may be ones Encode refuses (e.g. "").
			return
		}
		again, err := Decode(&b, int64(b.Len()))
		if err != nil {
			t.Fatalf("re-decoding: %v", err)
		}
		if err := sameTensors(file.Tensors, again.Tensors); err != nil {
			t.Fatal(err)
		}
		if !maps.Equal(file.Meta, again.Meta) || !again.Verified {
			t.Fatalf("meta %v vs %v, verified %v", file.Meta, again.Meta, again.Verified)
		}
	})
}
