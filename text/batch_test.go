package text

import (
	"slices"
	"testing"
)

func TestSampler(t *testing.T) {
	tokens := iota32(1000)
	s, err := NewSampler(tokens, 4, 16, 7)
	if err != nil {
		t.Fatal(err)
	}
	b := s.Next()
	if !slices.Equal(b.X.Shape, []int{4, 16}) || !slices.Equal(b.Y.Shape, []int{4, 16}) {
		t.Fatalf("shapes %v %v, want [4 16]", b.X.Shape, b.Y.Shape)
	}
	for r, st := range b.Start {
		for k := range 16 {
			if b.X.Data[r*16+k] != float32(st+k) || b.Y.Data[r*16+k] != float32(st+k+1) {
				t.Fatalf("row %d from %d: x %v y %v", r, st, b.X.Data[r*16+k], b.Y.Data[r*16+k])
			}
		}
	}
	if l := b.Labels(); len(l) != 64 || l[0] != b.Start[0]+1 {
		t.Errorf("Labels = %v", l)
	}
	s1, _ := NewSampler(tokens, 4, 16, 7)
	s2, _ := NewSampler(tokens, 4, 16, 7)
	if !slices.Equal(s1.Next().Start, b.Start) {
		t.Fatal("a new sampler with the same seed drew a different first batch")
	}
	s2.Next()
	for range 10 {
		if x, y := s1.Next(), s2.Next(); !slices.Equal(x.Start, y.Start) {
			t.Fatal("the same seed drew different windows")
		}
	}
}

func TestSamplerReachesEveryStart(t *testing.T) {
	tokens := iota32(12)
	s, err := NewSampler(tokens, 8, 10, 1)
	if err != nil {
		t.Fatal(err)
	}
	seen := map[int]bool{}
	for range 50 {
		for _, st := range s.Next().Start {
			if st < 0 || st+10 >= len(tokens) {
				t.Fatalf("window start %d leaves no target", st)
			}
			seen[st] = true
		}
	}
	if len(seen) != 2 {
		t.Errorf("starts %v, want both 0 and 1", seen)
	}
}

func TestWindows(t *testing.T) {
	tokens := iota32(103)
	seq, batches, targets := 10, 0, 0
	windows, err := Windows(tokens, 4, seq)
	if err != nil {
		t.Fatal(err)
	}
	next := int32(1)
	for b := range windows {
		batches++
		for _, y := range b.Y.Data {
			if int32(y) != next {
				t.Fatalf("target %v, want %d", y, next)
			}
			next++
			targets++
		}
	}
	if batches != 3 || targets != 100 {
		t.Errorf("%d batches, %d targets; want 3 and 100", batches, targets)
	}
}

func TestWindowErrors(t *testing.T) {
	if _, err := NewSampler(iota32(10), 1, 10, 1); err == nil {
		t.Error("a window with no target accepted")
	}
	if _, err := NewSampler(iota32(10), 0, 2, 1); err == nil {
		t.Error("batch 0 accepted")
	}
	if _, err := Windows([]int32{1, -2, 3}, 1, 1); err == nil {
		t.Error("negative id accepted")
	}
}
