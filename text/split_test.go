package text

import (
	"slices"
	"testing"
)

func iota32(n int) []int32 {
	t := make([]int32, n)
	for i := range t {
		t[i] = int32(i)
	}
	return t
}

func TestSplitDisjointCoverDeterministic(t *testing.T) {
	tokens := iota32(10007)
	train, val, err := Split(tokens, 0.1, 42)
	if err != nil {
		t.Fatal(err)
	}
	if len(train)+len(val) != len(tokens) {
		t.Fatalf("%d + %d tokens, want %d", len(train), len(val), len(tokens))
	}
	seen := make([]bool, len(tokens))
	for _, part := range [][]int32{train, val} {
		if !slices.IsSorted(part) {
			t.Fatal("a part is not in corpus order")
		}
		for _, id := range part {
			if seen[id] {
				t.Fatalf("token %d is in both parts", id)
			}
			seen[id] = true
		}
	}
	// Validation is made of 10 contiguous blocks of about 100 tokens.
	runs := 1
	for i := 1; i < len(val); i++ {
		if val[i] != val[i-1]+1 {
			runs++
		}
	}
	if runs > 10 || len(val) < 900 || len(val) > 1100 {
		t.Errorf("validation has %d tokens in %d runs, want ~1000 in <= 10", len(val), runs)
	}
	train2, val2, err := Split(tokens, 0.1, 42)
	if err != nil || !slices.Equal(train, train2) || !slices.Equal(val, val2) {
		t.Fatal("the same seed gave a different split")
	}
	_, val3, err := Split(tokens, 0.1, 43)
	if err != nil || slices.Equal(val, val3) {
		t.Error("another seed gave the same split")
	}
}

func TestSplitEdges(t *testing.T) {
	train, val, err := Split(iota32(50), 0, 1)
	if err != nil || len(val) != 0 || len(train) != 50 {
		t.Errorf("fraction 0: %d/%d, %v", len(train), len(val), err)
	}
	train, val, err = Split(iota32(5), 0.9, 1)
	if err != nil || len(val) != 4 || len(train) != 1 {
		t.Errorf("5 tokens at 0.9: %d/%d, %v; want a token left for training", len(train), len(val), err)
	}
	for _, f := range []float64{-0.1, 1, 2} {
		if _, _, err := Split(iota32(50), f, 1); err == nil {
			t.Errorf("fraction %v accepted", f)
		}
	}
	if _, _, err := Split(iota32(1), 0.5, 1); err == nil {
		t.Error("one token split into two parts")
	}
}
