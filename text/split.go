package text

import (
	"fmt"
	"math"
	"math/rand/v2"
)

// SplitBlocks is the number of contiguous blocks Split cuts a token stream
// into (fewer when there are fewer tokens).
const SplitBlocks = 100

// Split divides tokens into a training and a validation part by contiguous
// blocks: the stream is cut into SplitBlocks blocks of (nearly) equal
// length, round(valFraction × blocks) of them — at least one when
// valFraction > 0, and never all — are drawn with the seed for validation,
// and each part keeps its blocks in their original order. Validation text is
// therefore long stretches the model never trains on, not tokens scattered
// among training neighbours. Each part is its blocks concatenated, so a
// window sampled from it may straddle the seam where a block of the other
// part was taken out. valFraction must be in [0, 1). The results are
// new slices; the same tokens, fraction and seed always give the same split.
func Split(tokens []int32, valFraction float64, seed uint64) (train, val []int32, err error) {
	if !(valFraction >= 0 && valFraction < 1) {
		return nil, nil, fmt.Errorf("text: validation fraction %v outside [0, 1)", valFraction)
	}
	n := len(tokens)
	blocks := min(SplitBlocks, n)
	nVal := int(math.Round(valFraction * float64(blocks)))
	if valFraction > 0 {
		nVal = max(nVal, 1)
	}
	if nVal >= blocks && nVal > 0 {
		if blocks < 2 {
			return nil, nil, fmt.Errorf("text: %d tokens are too few to split off a validation part", n)
		}
		nVal = blocks - 1
	}
	isVal := make([]bool, blocks)
	for _, b := range rand.New(rand.NewPCG(seed, 0x5eed)).Perm(blocks)[:nVal] {
		isVal[b] = true
	}
	train = make([]int32, 0, n)
	for b := range blocks {
		lo, hi := shardBound(n, b, blocks), shardBound(n, b+1, blocks)
		if isVal[b] {
			val = append(val, tokens[lo:hi]...)
		} else {
			train = append(train, tokens[lo:hi]...)
		}
	}
	return train, val, nil
}

// shardBound returns floor(total*i/n) without overflowing.
func shardBound(total, i, n int) int {
	q, r := total/n, total%n
	return q*i + r*i/n
}
