package data

import (
	"bytes"
	"compress/gzip"
	"context"
	"encoding/binary"
	"errors"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// idxBytes encodes an unsigned-byte IDX array.
func idxBytes(dims []int, data []byte) []byte {
	var b bytes.Buffer
	b.Write([]byte{0, 0, idxTypeUbyte, byte(len(dims))})
	for _, d := range dims {
		binary.Write(&b, binary.BigEndian, uint32(d))
	}
	b.Write(data)
	return b.Bytes()
}

func gzipBytes(t testing.TB, raw []byte) []byte {
	t.Helper()
	var b bytes.Buffer
	zw := gzip.NewWriter(&b)
	if _, err := zw.Write(raw); err != nil {
		t.Fatal(err)
	}
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

// writeSet writes a small Fashion-MNIST-shaped split into dir. Image i has
// every pixel equal to i*10 and label i%10.
func writeSet(t *testing.T, dir string, set Set, n int, gz bool) (images, labels []byte) {
	t.Helper()
	img := make([]byte, n*ImageSize)
	lbl := make([]byte, n)
	for i := range n {
		for p := range ImageSize {
			img[i*ImageSize+p] = byte(i * 10)
		}
		lbl[i] = byte(i % NumClasses)
	}
	images = idxBytes([]int{n, ImageSide, ImageSide}, img)
	labels = idxBytes([]int{n}, lbl)
	write := func(name string, raw []byte) {
		path := filepath.Join(dir, set.String()+name)
		if gz {
			raw, path = gzipBytes(t, raw), path+".gz"
		}
		if err := os.WriteFile(path, raw, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("-images-idx3-ubyte", images)
	write("-labels-idx1-ubyte", labels)
	return images, labels
}

func TestLoadSmall(t *testing.T) {
	for _, gz := range []bool{true, false} {
		dir := t.TempDir()
		writeSet(t, dir, Test, 5, gz)
		d, err := LoadFashionMNIST(dir, Test, LoadOptions{})
		if err != nil {
			t.Fatalf("gz=%v: %v", gz, err)
		}
		if d.Len() != 5 || d.X.Shape[0] != 5 || d.X.Shape[1] != ImageSize {
			t.Fatalf("gz=%v: shape %v, len %d", gz, d.X.Shape, d.Len())
		}
		for i := range 5 {
			if d.Y[i] != i {
				t.Errorf("label %d = %d", i, d.Y[i])
			}
			want := float32(i*10) / 255
			if got := d.X.Data[i*ImageSize+100]; got != want {
				t.Errorf("pixel of image %d = %v, want %v", i, got, want)
			}
		}

		s, err := LoadFashionMNIST(dir, Test, LoadOptions{Standardize: true, Limit: 3})
		if err != nil {
			t.Fatal(err)
		}
		if s.Len() != 3 {
			t.Fatalf("limit: len %d", s.Len())
		}
		want := (float32(20)/255 - PixelMean) / PixelStd
		if got := s.X.Data[2*ImageSize]; math.Abs(float64(got-want)) > 1e-6 {
			t.Errorf("standardized pixel %v, want %v", got, want)
		}
	}
}

// TestLoadCancelled checks that a cancelled context stops the load with the
// context's error, for compressed and raw files.
func TestLoadCancelled(t *testing.T) {
	for _, gz := range []bool{true, false} {
		dir := t.TempDir()
		writeSet(t, dir, Test, 5, gz)
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		if _, err := LoadFashionMNISTContext(ctx, dir, Test, LoadOptions{}); !errors.Is(err, context.Canceled) {
			t.Errorf("gz=%v: %v, want context.Canceled", gz, err)
		}
		if _, err := LoadFashionMNISTContext(context.Background(), dir, Test, LoadOptions{}); err != nil {
			t.Errorf("gz=%v: %v", gz, err)
		}
	}
}

func TestLoadMissing(t *testing.T) {
	dir := t.TempDir()
	_, err := LoadFashionMNIST(dir, Train, LoadOptions{})
	if err == nil {
		t.Fatal("no error for a missing dataset")
	}
	want := filepath.Join(dir, "train-images-idx3-ubyte.gz")
	for _, s := range []string{want, "apt-get install dataset-fashion-mnist", "make setup"} {
		if !strings.Contains(err.Error(), s) {
			t.Errorf("error %q does not mention %q", err, s)
		}
	}
	if !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("error %v does not wrap fs.ErrNotExist", err)
	}
}

func TestLoadCorrupt(t *testing.T) {
	const n = 4
	cases := []struct {
		name    string
		file    string // which file is damaged
		gz      bool
		corrupt func(images, labels []byte) (img, lbl []byte)
	}{
		{"truncated images", "t10k-images-idx3-ubyte", false, func(i, l []byte) ([]byte, []byte) { return i[:len(i)-7], l }},
		{"truncated header", "t10k-labels-idx1-ubyte", false, func(i, l []byte) ([]byte, []byte) { return i, l[:6] }},
		{"empty", "t10k-labels-idx1-ubyte", false, func(i, l []byte) ([]byte, []byte) { return i, nil }},
		{"trailing bytes", "t10k-images-idx3-ubyte", false, func(i, l []byte) ([]byte, []byte) { return append(i, 1, 2), l }},
		{"bad magic", "t10k-images-idx3-ubyte", false, func(i, l []byte) ([]byte, []byte) {
			i = bytes.Clone(i)
			i[0] = 0x1f
			return i, l
		}},
		{"int type", "t10k-labels-idx1-ubyte", false, func(i, l []byte) ([]byte, []byte) {
			l = bytes.Clone(l)
			l[2] = idxTypeInt
			return i, l
		}},
		{"wrong image size", "t10k-images-idx3-ubyte", false, func(i, l []byte) ([]byte, []byte) {
			return idxBytes([]int{n, 27, 28}, make([]byte, n*27*28)), l
		}},
		{"label out of range", "t10k-labels-idx1-ubyte", false, func(i, l []byte) ([]byte, []byte) {
			return i, idxBytes([]int{n}, []byte{0, 1, 10, 2})
		}},
		{"count mismatch", "t10k-labels-idx1-ubyte", false, func(i, l []byte) ([]byte, []byte) {
			return i, idxBytes([]int{n - 1}, []byte{0, 1, 2})
		}},
		{"huge header", "t10k-images-idx3-ubyte", false, func(i, l []byte) ([]byte, []byte) {
			return idxBytes([]int{1 << 30, 28, 28}, nil), l
		}},
		{"truncated gzip", "t10k-images-idx3-ubyte.gz", true, func(i, l []byte) ([]byte, []byte) { return i[:len(i)/2], l }},
		{"gzip crc", "t10k-images-idx3-ubyte.gz", true, func(i, l []byte) ([]byte, []byte) {
			i = bytes.Clone(i)
			i[len(i)-6] ^= 0xff // inside the CRC-32 trailer
			return i, l
		}},
		{"not gzip", "t10k-labels-idx1-ubyte.gz", true, func(i, l []byte) ([]byte, []byte) { return i, []byte("hello, world") }},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			images, labels := writeSet(t, dir, Test, n, false)
			if tc.gz {
				images, labels = gzipBytes(t, images), gzipBytes(t, labels)
			}
			img, lbl := tc.corrupt(images, labels)
			suffix := ""
			if tc.gz {
				suffix = ".gz"
				// Replace the raw files with gzipped ones.
				os.Remove(filepath.Join(dir, "t10k-images-idx3-ubyte"))
				os.Remove(filepath.Join(dir, "t10k-labels-idx1-ubyte"))
			}
			os.WriteFile(filepath.Join(dir, "t10k-images-idx3-ubyte"+suffix), img, 0o644)
			os.WriteFile(filepath.Join(dir, "t10k-labels-idx1-ubyte"+suffix), lbl, 0o644)

			_, err := LoadFashionMNIST(dir, Test, LoadOptions{})
			if err == nil {
				t.Fatal("corrupt file accepted")
			}
			path := filepath.Join(dir, tc.file)
			if !strings.Contains(err.Error(), path+" ") {
				t.Errorf("error %q does not name %s", err, path)
			}
			if !strings.Contains(err.Error(), "apt-get install dataset-fashion-mnist") {
				t.Errorf("error %q has no install hint", err)
			}
		})
	}
}

func TestReadIDXErrors(t *testing.T) {
	cases := map[string][]byte{
		"rank 0":        {0, 0, 8, 0},
		"rank 9":        {0, 0, 8, 9},
		"unknown type":  {0, 0, 7, 1, 0, 0, 0, 1, 5},
		"product limit": idxBytes([]int{1000, 1000}, nil),
		"short dims":    {0, 0, 8, 2, 0, 0, 0, 1},
	}
	for name, in := range cases {
		if _, err := ReadIDX(bytes.NewReader(in), 1000); !errors.Is(err, ErrIDXFormat) {
			t.Errorf("%s: err = %v, want ErrIDXFormat", name, err)
		}
	}
	// A zero dimension is a valid, empty array.
	idx, err := ReadIDX(bytes.NewReader(idxBytes([]int{0, 5}, nil)), 1000)
	if err != nil || len(idx.Data) != 0 || idx.Dims[1] != 5 {
		t.Errorf("empty array: %v, %v", idx, err)
	}
}

// TestLoadReal loads the installed dataset, if there is one.
func TestLoadReal(t *testing.T) {
	if _, err := os.Stat(filepath.Join(DefaultDir, "train-labels-idx1-ubyte.gz")); err != nil {
		t.Skipf("Fashion-MNIST not installed (%v); %s", err, InstallHint)
	}
	start := time.Now()
	train, err := LoadFashionMNIST("", Train, LoadOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("loaded %d training images in %v", train.Len(), time.Since(start))
	test, err := LoadFashionMNIST(DefaultDir, Test, LoadOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		d    *Dataset
		n    int
		name string
	}{{train, TrainSize, "train"}, {test, TestSize, "test"}} {
		if c.d.Len() != c.n || c.d.X.Shape[0] != c.n || c.d.X.Shape[1] != ImageSize {
			t.Fatalf("%s: len %d, shape %v", c.name, c.d.Len(), c.d.X.Shape)
		}
		// Fashion-MNIST is exactly balanced.
		var hist [NumClasses]int
		for _, y := range c.d.Y {
			hist[y]++
		}
		for k, h := range hist {
			if h != c.n/NumClasses {
				t.Errorf("%s: class %d (%s) has %d examples, want %d", c.name, k, ClassNames()[k], h, c.n/NumClasses)
			}
		}
	}
	var sum float64
	for _, v := range train.X.Data {
		if v < 0 || v > 1 {
			t.Fatalf("pixel %v outside [0,1]", v)
		}
		sum += float64(v)
	}
	if mean := sum / float64(len(train.X.Data)); math.Abs(mean-PixelMean) > 1e-3 {
		t.Errorf("mean pixel %.4f, want %.4f", mean, PixelMean)
	}
}

func FuzzIDX(f *testing.F) {
	f.Add(idxBytes([]int{2, 3}, []byte{1, 2, 3, 4, 5, 6}))
	f.Add(idxBytes([]int{1, ImageSide, ImageSide}, make([]byte, ImageSize)))
	f.Add(idxBytes([]int{4}, []byte{0, 9, 3}))
	f.Add(idxBytes([]int{1 << 20, 1 << 20}, nil))
	f.Add([]byte{0, 0, 8, 0})
	f.Add([]byte{0, 0, 0x0d, 1, 0, 0, 0, 1, 0, 0, 0, 0})
	const limit = 1 << 16
	f.Fuzz(func(t *testing.T, in []byte) {
		idx, err := ReadIDX(bytes.NewReader(in), limit)
		if err != nil {
			if !errors.Is(err, ErrIDXFormat) {
				t.Fatalf("error %v does not wrap ErrIDXFormat", err)
			}
			return
		}
		n := 1
		for _, d := range idx.Dims {
			n *= d
		}
		if n > limit || len(idx.Data) != n || len(in) != 4+4*len(idx.Dims)+n {
			t.Fatalf("dims %v, %d data bytes from %d input bytes", idx.Dims, len(idx.Data), len(in))
		}
		if !bytes.Equal(idxBytes(idx.Dims, idx.Data), in) {
			t.Fatal("re-encoding differs from the input")
		}
	})
}

// LoadFashionMNISTSplits reads the limited training split and the whole
// test split, standardized; a missing split is an error.
func TestLoadFashionMNISTSplits(t *testing.T) {
	dir := t.TempDir()
	writeSet(t, dir, Train, 6, true)
	if _, _, err := LoadFashionMNISTSplits(dir, 0); err == nil {
		t.Fatal("no error without the test split")
	}
	writeSet(t, dir, Test, 5, true)
	tr, te, err := LoadFashionMNISTSplits(dir, 4)
	if err != nil {
		t.Fatal(err)
	}
	want := (float32(20)/255 - PixelMean) / PixelStd
	if tr.Len() != 4 || te.Len() != 5 || math.Abs(float64(te.X.Data[2*ImageSize]-want)) > 1e-6 {
		t.Errorf("train %d, test %d examples, standardized pixel %v (want %v)", tr.Len(), te.Len(), te.X.Data[2*ImageSize], want)
	}
}
