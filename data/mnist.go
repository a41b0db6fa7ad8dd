package data

import (
	"bufio"
	"compress/gzip"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"sync"

	"github.com/skyhive/skyhive/tensor"
)

// DefaultDir is where Debian's dataset-fashion-mnist package installs the
// Fashion-MNIST IDX files. The CLI's --data-dir flag overrides it.
const DefaultDir = "/usr/share/datasets/fashion-mnist"

// InstallHint tells the user how to get the Fashion-MNIST files.
const InstallHint = "install Fashion-MNIST with `apt-get install dataset-fashion-mnist` (or `make setup`)"

// Fashion-MNIST geometry.
const (
	// ImageSide is the width and height of an image in pixels.
	ImageSide = 28
	// ImageSize is the number of pixels per image (the feature count).
	ImageSize = ImageSide * ImageSide
	// NumClasses is the number of clothing classes.
	NumClasses = 10
	// TrainSize and TestSize are the number of images in each split.
	TrainSize = 60000
	TestSize  = 10000
)

// Mean and standard deviation of the Fashion-MNIST training pixels after
// scaling to [0,1]; Standardize uses them.
const (
	PixelMean = 0.2860
	PixelStd  = 0.3530
)

// maxMNISTItems bounds the image count a header may announce (Fashion-MNIST
// has 60000; extended variants stay well below this).
const maxMNISTItems = 1 << 20

// ClassNames returns the Fashion-MNIST class names indexed by label.
func ClassNames() []string {
	return []string{
		"T-shirt/top", "Trouser", "Pullover", "Dress", "Coat",
		"Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot",
	}
}

// Set selects the training or the test split.
type Set int

// The two Fashion-MNIST splits.
const (
	Train Set = iota // 60000 images, files train-*
	Test             // 10000 images, files t10k-*
)

// String returns the file prefix of the split ("train" or "t10k").
func (s Set) String() string {
	switch s {
	case Train:
		return "train"
	case Test:
		return "t10k"
	}
	return fmt.Sprintf("Set(%d)", int(s))
}

// LoadOptions tunes LoadFashionMNIST.
type LoadOptions struct {
	// Standardize maps pixels to (x - PixelMean) / PixelStd instead of
	// leaving them in [0,1].
	Standardize bool
	// Limit, when positive, keeps only the first Limit examples.
	Limit int
}

// LoadFashionMNIST reads one split of Fashion-MNIST from dir (DefaultDir
// when dir is empty). It looks for <set>-images-idx3-ubyte.gz and
// <set>-labels-idx1-ubyte.gz and falls back to the same names without .gz.
//
// The result has X of shape [N, 784] with pixels scaled to [0,1] (x/255,
// row-major 28×28) or standardized when opt.Standardize is set, and Y with
// labels in [0,10). Errors name the offending file and, when a file is
// missing or corrupt, say how to install the dataset.
func LoadFashionMNIST(dir string, set Set, opt LoadOptions) (*Dataset, error) {
	return LoadFashionMNISTContext(context.Background(), dir, set, opt)
}

// LoadFashionMNISTSplits reads the training split, its first limit
// examples when limit is positive, and the test split of Fashion-MNIST
// from dir, both standardized (LoadFashionMNIST).
func LoadFashionMNISTSplits(dir string, limit int) (trainSet, testSet *Dataset, err error) {
	if trainSet, err = LoadFashionMNIST(dir, Train, LoadOptions{Standardize: true, Limit: limit}); err != nil {
		return nil, nil, err
	}
	if testSet, err = LoadFashionMNIST(dir, Test, LoadOptions{Standardize: true}); err != nil {
		return nil, nil, err
	}
	return trainSet, testSet, nil
}

// LoadFashionMNISTContext is LoadFashionMNIST that stops reading, with
// ctx's error, once ctx is cancelled (decoding the training split takes
// about a second).
func LoadFashionMNISTContext(ctx context.Context, dir string, set Set, opt LoadOptions) (*Dataset, error) {
	if set != Train && set != Test {
		return nil, fmt.Errorf("data: unknown Fashion-MNIST split %v", set)
	}
	if dir == "" {
		dir = DefaultDir
	}
	images, imgPath, err := readIDXFile(ctx, filepath.Join(dir, set.String()+"-images-idx3-ubyte"), maxMNISTItems*ImageSize)
	if err != nil {
		return nil, err
	}
	if len(images.Dims) != 3 || images.Dims[1] != ImageSide || images.Dims[2] != ImageSide {
		return nil, fileError(imgPath, fmt.Errorf("%w: image dimensions %v, want [N %d %d]", ErrIDXFormat, images.Dims, ImageSide, ImageSide))
	}
	labels, lblPath, err := readIDXFile(ctx, filepath.Join(dir, set.String()+"-labels-idx1-ubyte"), maxMNISTItems)
	if err != nil {
		return nil, err
	}
	if len(labels.Dims) != 1 {
		return nil, fileError(lblPath, fmt.Errorf("%w: label dimensions %v, want [N]", ErrIDXFormat, labels.Dims))
	}
	n := images.Dims[0]
	if labels.Dims[0] != n {
		return nil, fileError(lblPath, fmt.Errorf("%w: %d labels for %d images in %s", ErrIDXFormat, labels.Dims[0], n, imgPath))
	}
	for i, l := range labels.Data {
		if l >= NumClasses {
			return nil, fileError(lblPath, fmt.Errorf("%w: label %d of example %d is outside [0,%d)", ErrIDXFormat, l, i, NumClasses))
		}
	}
	if opt.Limit > 0 && opt.Limit < n {
		n = opt.Limit
	}

	var lut [256]float32
	for i := range lut {
		v := float32(i) / 255
		if opt.Standardize {
			v = (v - PixelMean) / PixelStd
		}
		lut[i] = v
	}
	x := make([]float32, n*ImageSize)
	// Converting is dominated by first-touch page faults on x; spread it
	// over the available cores.
	parts := min(runtime.GOMAXPROCS(0), 4, max(1, n/1024))
	var wg sync.WaitGroup
	for p := range parts {
		lo, hi := len(x)*p/parts, len(x)*(p+1)/parts
		wg.Go(func() {
			dst, src := x[lo:hi], images.Data[lo:hi]
			for i, b := range src {
				dst[i] = lut[b]
			}
		})
	}
	wg.Wait()
	y := make([]int, n)
	for i := range y {
		y[i] = int(labels.Data[i])
	}
	return &Dataset{X: tensor.FromSlice(x, n, ImageSize), Y: y}, nil
}

// readIDXFile opens base+".gz" (gunzipping it) or, if that does not exist,
// base itself, and decodes it, until ctx is cancelled. It returns the path
// it read.
func readIDXFile(ctx context.Context, base string, maxElems int) (*IDX, string, error) {
	path := base + ".gz"
	f, err := os.Open(path)
	if errors.Is(err, fs.ErrNotExist) {
		if raw, rawErr := os.Open(base); rawErr == nil {
			f, path, err = raw, base, nil
		}
	}
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil, path, fmt.Errorf("data: %s (or uncompressed %s) not found; %s: %w", path, filepath.Base(base), InstallHint, err)
		}
		return nil, path, fileError(path, err)
	}
	defer f.Close()

	// A trusted bound on the decoded size lets the decoder allocate once:
	// the file size for raw files, and for gzip the uncompressed size the
	// trailer records, checked against deflate's maximum ratio of 1032:1.
	bound := 0
	if st, err := f.Stat(); err == nil && st.Mode().IsRegular() {
		bound = int(min(st.Size(), 1<<40))
		if path != base {
			bound = gzipSizeBound(f, st.Size())
		}
	}
	var r io.Reader = bufio.NewReaderSize(ctxReader{ctx, f}, 1<<16)
	if path != base {
		zr, err := gzip.NewReader(r)
		if err != nil {
			return nil, path, fileError(path, fmt.Errorf("%w: not a gzip file: %w", ErrIDXFormat, err))
		}
		defer zr.Close()
		r = zr
	}
	idx, err := readIDX(r, maxElems, bound)
	if err != nil {
		return nil, path, fileError(path, err)
	}
	return idx, path, nil
}

// ctxReader reads r until ctx is cancelled, then fails with ctx's error.
type ctxReader struct {
	ctx context.Context
	r   io.Reader
}

func (c ctxReader) Read(p []byte) (int, error) {
	if err := c.ctx.Err(); err != nil {
		return 0, err
	}
	return c.r.Read(p)
}

// gzipSizeBound returns the uncompressed size recorded in the trailer of the
// gzip file f of the given size, or 0 if that is not plausible.
func gzipSizeBound(f *os.File, size int64) int {
	const maxRatio = 1032
	var trailer [4]byte
	if size < 18 || size > 1<<30 {
		return 0
	}
	if _, err := f.ReadAt(trailer[:], size-4); err != nil {
		return 0
	}
	isize := int64(binary.LittleEndian.Uint32(trailer[:]))
	if isize > maxRatio*size {
		return 0
	}
	return int(isize)
}

// fileError wraps err with the file path and, for corrupt files, the hint.
func fileError(path string, err error) error {
	if errors.Is(err, ErrIDXFormat) || errors.Is(err, gzip.ErrChecksum) || errors.Is(err, gzip.ErrHeader) {
		return fmt.Errorf("data: %s is corrupt (%w); reinstall it: %s", path, err, InstallHint)
	}
	return fmt.Errorf("data: %s: %w", path, err)
}
