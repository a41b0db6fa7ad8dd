package data

import (
	"slices"
	"testing"

	"github.com/skyhive/skyhive/tensor"
)

// seqDataset has n examples of 3 features; example i is (i, i, i) with label i.
func seqDataset(t *testing.T, n int) *Dataset {
	t.Helper()
	x := make([]float32, 3*n)
	y := make([]int, n)
	for i := range n {
		x[3*i], x[3*i+1], x[3*i+2] = float32(i), float32(i), float32(i)
		y[i] = i
	}
	d, err := NewDataset(tensor.FromSlice(x, n, 3), y)
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// checkConsistent verifies that every example's features match its label.
func checkConsistent(t *testing.T, x *tensor.Tensor, y []int) {
	t.Helper()
	if x.Shape[0] != len(y) || len(x.Data) != 3*len(y) {
		t.Fatalf("shape %v for %d labels", x.Shape, len(y))
	}
	for j, l := range y {
		for f := range 3 {
			if x.Data[3*j+f] != float32(l) {
				t.Fatalf("example %d: features %v, label %d", j, x.Data[3*j:3*j+3], l)
			}
		}
	}
}

func TestNewDatasetValidates(t *testing.T) {
	if _, err := NewDataset(tensor.New(3, 2), []int{1, 2}); err == nil {
		t.Error("length mismatch accepted")
	}
	if _, err := NewDataset(&tensor.Tensor{Shape: []int{2, 2}, Data: make([]float32, 3)}, []int{1, 2}); err == nil {
		t.Error("inconsistent tensor accepted")
	}
	if _, err := NewDataset(&tensor.Tensor{Shape: []int{-1, -2}, Data: make([]float32, 2)}, nil); err == nil {
		t.Error("negative shape accepted")
	}
	if _, err := NewDataset(nil, nil); err == nil {
		t.Error("nil tensor accepted")
	}
}

func TestLoaderCoversAndIsDeterministic(t *testing.T) {
	d := seqDataset(t, 103)
	for _, drop := range []bool{false, true} {
		l, err := NewLoader(d, BatchOptions{Size: 10, Shuffle: true, Seed: 7, DropLast: drop})
		if err != nil {
			t.Fatal(err)
		}
		wantBatches := 11
		if drop {
			wantBatches = 10
		}
		if l.Len() != wantBatches {
			t.Fatalf("drop=%v: Len %d, want %d", drop, l.Len(), wantBatches)
		}
		var seen []int
		nb := 0
		for b, batch := range l.Epoch(0) {
			if b != nb {
				t.Fatalf("batch index %d, want %d", b, nb)
			}
			nb++
			checkConsistent(t, batch.X, batch.Y)
			if !slices.Equal(batch.Y, batch.Index) {
				t.Fatal("Index does not match labels")
			}
			if batch.Len() != 10 && (drop || b != 10) {
				t.Fatalf("batch %d has %d examples", b, batch.Len())
			}
			seen = append(seen, batch.Y...)
		}
		if nb != wantBatches {
			t.Fatalf("%d batches, want %d", nb, wantBatches)
		}
		if !drop {
			slices.Sort(seen)
			for i, v := range seen {
				if v != i {
					t.Fatalf("epoch does not visit every example once: %v", seen)
				}
			}
		}
	}

	a, _ := NewLoader(d, BatchOptions{Size: 8, Shuffle: true, Seed: 42})
	b, _ := NewLoader(d, BatchOptions{Size: 8, Shuffle: true, Seed: 42})
	c, _ := NewLoader(d, BatchOptions{Size: 8, Shuffle: true, Seed: 43})
	if !slices.Equal(a.Order(3), b.Order(3)) {
		t.Error("same seed and epoch give different orders")
	}
	if slices.Equal(a.Order(3), a.Order(4)) {
		t.Error("epochs 3 and 4 have the same order")
	}
	if slices.Equal(a.Order(3), c.Order(3)) {
		t.Error("seeds 42 and 43 give the same order")
	}
	if slices.IsSorted(a.Order(0)) {
		t.Error("shuffled order is sorted")
	}
	plain, _ := NewLoader(d, BatchOptions{Size: 8})
	if !slices.IsSorted(plain.Order(5)) {
		t.Error("unshuffled order is not sorted")
	}

	// Breaking out of the loop early must be safe.
	for range a.Epoch(1) {
		break
	}
	if _, err := NewLoader(d, BatchOptions{Size: 0}); err == nil {
		t.Error("batch size 0 accepted")
	}
}

func TestShardDisjointCovering(t *testing.T) {
	for _, total := range []int{0, 1, 7, 100, 101} {
		d := seqDataset(t, total)
		for _, n := range []int{1, 2, 3, 8} {
			var all []int
			sizes := map[int]bool{}
			for i := range n {
				s, err := d.Shard(i, n)
				if err != nil {
					t.Fatal(err)
				}
				checkConsistent(t, s.X, s.Y)
				all = append(all, s.Y...)
				sizes[s.Len()] = true
			}
			if !slices.Equal(all, d.Y) {
				t.Errorf("N=%d n=%d: shards concatenate to %v", total, n, all)
			}
			lo, hi := total, 0
			for s := range sizes {
				lo, hi = min(lo, s), max(hi, s)
			}
			if hi-lo > 1 {
				t.Errorf("N=%d n=%d: shard sizes %v differ by more than one", total, n, sizes)
			}
		}
	}
	d := seqDataset(t, 10)
	for _, bad := range [][2]int{{-1, 2}, {2, 2}, {0, 0}} {
		if _, err := d.Shard(bad[0], bad[1]); err == nil {
			t.Errorf("Shard(%d, %d) accepted", bad[0], bad[1])
		}
	}
}

func TestSplitAndSubset(t *testing.T) {
	d := seqDataset(t, 50)
	a, b, err := d.Split(12, 1)
	if err != nil {
		t.Fatal(err)
	}
	if a.Len() != 12 || b.Len() != 38 {
		t.Fatalf("split sizes %d, %d", a.Len(), b.Len())
	}
	checkConsistent(t, a.X, a.Y)
	checkConsistent(t, b.X, b.Y)
	all := append(slices.Clone(a.Y), b.Y...)
	slices.Sort(all)
	if !slices.Equal(all, d.Y) {
		t.Error("split halves do not partition the dataset")
	}
	a2, _, _ := d.Split(12, 1)
	if !slices.Equal(a.Y, a2.Y) {
		t.Error("split is not deterministic")
	}
	if _, _, err := d.Split(51, 1); err == nil {
		t.Error("oversized split accepted")
	}

	s := d.Subset([]int{4, 4, 0})
	if !slices.Equal(s.Y, []int{4, 4, 0}) {
		t.Errorf("subset labels %v", s.Y)
	}
	checkConsistent(t, s.X, s.Y)
	s.X.Data[0] = -1
	if d.X.Data[12] != 4 {
		t.Error("Subset shares memory with the source")
	}
}

func TestTokenSource(t *testing.T) {
	cfg := TokenConfig{Batch: 16, SeqLen: 32, Vocab: 100, Classes: 3, MinLen: 4}
	a, err := NewTokenSource(cfg, 9)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := NewTokenSource(cfg, 9)
	c, _ := NewTokenSource(cfg, 10)
	padded := false
	for range 5 {
		x, y, z := a.Next(), b.Next(), c.Next()
		if !slices.Equal(x.IDs.Data, y.IDs.Data) || !slices.Equal(x.Labels, y.Labels) {
			t.Fatal("same seed gives different batches")
		}
		if slices.Equal(x.IDs.Data, z.IDs.Data) {
			t.Fatal("different seeds give the same batch")
		}
		if !slices.Equal(x.IDs.Shape, []int{16, 32}) || !slices.Equal(x.Mask.Shape, []int{16, 32}) {
			t.Fatalf("shapes %v %v", x.IDs.Shape, x.Mask.Shape)
		}
		for s := range 16 {
			n := x.Lengths[s]
			if n < 4 || n > 32 {
				t.Fatalf("length %d", n)
			}
			padded = padded || n < 32
			if l := x.Labels[s]; l < 0 || l >= 3 {
				t.Fatalf("label %d", l)
			}
			for p := range 32 {
				id, m := x.IDs.Data[s*32+p], x.Mask.Data[s*32+p]
				if p < n && (m != 1 || id < 1 || id >= 100 || id != float32(int(id))) {
					t.Fatalf("token %d,%d: id %v mask %v", s, p, id, m)
				}
				if p >= n && (m != 0 || id != 0) {
					t.Fatalf("pad %d,%d: id %v mask %v", s, p, id, m)
				}
			}
		}
	}
	if !padded {
		t.Error("no sequence was padded")
	}
	for _, bad := range []TokenConfig{
		{Batch: 0, SeqLen: 4, Vocab: 10, Classes: 2},
		{Batch: 1, SeqLen: 4, Vocab: 1, Classes: 2},
		{Batch: 1, SeqLen: 4, Vocab: 10, Classes: 0},
		{Batch: 1, SeqLen: 4, Vocab: 10, Classes: 2, MinLen: 5},
		{Batch: 1, SeqLen: 4, Vocab: 1 << 25, Classes: 2},
	} {
		if _, err := NewTokenSource(bad, 1); err == nil {
			t.Errorf("config %+v accepted", bad)
		}
	}
}

func TestGaussianBlobs(t *testing.T) {
	d, err := GaussianBlobs(300, 8, 3, 5)
	if err != nil {
		t.Fatal(err)
	}
	if d.Len() != 300 || !slices.Equal(d.X.Shape, []int{300, 8}) {
		t.Fatalf("shape %v", d.X.Shape)
	}
	// Nearest class mean must classify most points: the task is learnable.
	means := make([][]float64, 3)
	for c := range means {
		means[c] = make([]float64, 8)
	}
	for i, y := range d.Y {
		for f := range 8 {
			means[y][f] += float64(d.X.Data[i*8+f]) / 100
		}
	}
	correct := 0
	for i, y := range d.Y {
		best, bestD := -1, 0.0
		for c := range 3 {
			dist := 0.0
			for f := range 8 {
				diff := float64(d.X.Data[i*8+f]) - means[c][f]
				dist += diff * diff
			}
			if best < 0 || dist < bestD {
				best, bestD = c, dist
			}
		}
		if best == y {
			correct++
		}
	}
	if correct < 270 {
		t.Errorf("nearest mean classifies only %d/300", correct)
	}
	e, _ := GaussianBlobs(300, 8, 3, 5)
	if !slices.Equal(d.X.Data, e.X.Data) {
		t.Error("not deterministic")
	}
	if _, err := GaussianBlobs(10, 0, 3, 1); err == nil {
		t.Error("zero features accepted")
	}
}
