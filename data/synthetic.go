package data

import (
	"fmt"
	"math/rand/v2"

	"github.com/skyhive/skyhive/tensor"
)

// maxVocab keeps token ids exactly representable as float32.
const maxVocab = 1 << 24

// TokenConfig describes synthetic BERT-style classification batches, used
// for timing runs where the content of the data does not matter.
type TokenConfig struct {
	// Batch is the number of sequences per batch.
	Batch int
	// SeqLen is the padded sequence length.
	SeqLen int
	// Vocab bounds the token ids: real tokens are drawn from [1, Vocab)
	// and id 0 is padding. It must be in [2, 2^24].
	Vocab int
	// Classes is the number of labels; labels are drawn from [0, Classes).
	Classes int
	// MinLen is the shortest unpadded length; 0 means 1. Lengths are
	// drawn uniformly from [MinLen, SeqLen].
	MinLen int
}

// TokenBatch is a batch of synthetic token sequences.
type TokenBatch struct {
	// IDs has shape [Batch, SeqLen] and holds token ids as float32; padded
	// positions hold 0.
	IDs *tensor.Tensor
	// Mask has shape [Batch, SeqLen]: 1 for a real token, 0 for padding.
	// Sequences are padded on the right.
	Mask *tensor.Tensor
	// Lengths holds the number of real tokens in each sequence.
	Lengths []int
	// Labels holds one class label per sequence.
	Labels []int
}

// TokenSource generates an endless, reproducible stream of TokenBatches.
// It is not safe for concurrent use.
type TokenSource struct {
	cfg TokenConfig
	rng *rand.Rand
}

// NewTokenSource validates cfg and returns a source seeded with seed: two
// sources with the same config and seed produce the same batches.
func NewTokenSource(cfg TokenConfig, seed uint64) (*TokenSource, error) {
	if cfg.MinLen == 0 {
		cfg.MinLen = 1
	}
	switch {
	case cfg.Batch < 1:
		return nil, fmt.Errorf("data: token batch size %d must be positive", cfg.Batch)
	case cfg.SeqLen < 1:
		return nil, fmt.Errorf("data: sequence length %d must be positive", cfg.SeqLen)
	case cfg.Vocab < 2 || cfg.Vocab > maxVocab:
		return nil, fmt.Errorf("data: vocabulary size %d outside [2, %d]", cfg.Vocab, maxVocab)
	case cfg.Classes < 1:
		return nil, fmt.Errorf("data: class count %d must be positive", cfg.Classes)
	case cfg.MinLen < 1 || cfg.MinLen > cfg.SeqLen:
		return nil, fmt.Errorf("data: minimum length %d outside [1, %d]", cfg.MinLen, cfg.SeqLen)
	}
	return &TokenSource{cfg: cfg, rng: rand.New(rand.NewPCG(seed, 0x70c3))}, nil
}

// Config returns the source's configuration (with defaults filled in).
func (s *TokenSource) Config() TokenConfig { return s.cfg }

// Next returns a new batch.
func (s *TokenSource) Next() TokenBatch {
	c := s.cfg
	ids := tensor.New(c.Batch, c.SeqLen)
	mask := tensor.New(c.Batch, c.SeqLen)
	lengths := make([]int, c.Batch)
	labels := make([]int, c.Batch)
	for b := range c.Batch {
		n := c.MinLen + s.rng.IntN(c.SeqLen-c.MinLen+1)
		lengths[b] = n
		row := b * c.SeqLen
		for t := range n {
			ids.Data[row+t] = float32(1 + s.rng.IntN(c.Vocab-1))
			mask.Data[row+t] = 1
		}
		labels[b] = s.rng.IntN(c.Classes)
	}
	return TokenBatch{IDs: ids, Mask: mask, Lengths: lengths, Labels: labels}
}

// GaussianBlobs returns n examples of a learnable synthetic classification
// task: each class has a random center drawn from N(0, 4·I) in `features`
// dimensions, and each example is its class center plus N(0, I) noise.
// Labels cycle through the classes so every class is represented.
func GaussianBlobs(n, features, classes int, seed uint64) (*Dataset, error) {
	if n < 0 || features < 1 || classes < 1 {
		return nil, fmt.Errorf("data: blobs need n >= 0, features >= 1, classes >= 1 (got %d, %d, %d)", n, features, classes)
	}
	if n > 0 && features > (1<<31)/n {
		return nil, fmt.Errorf("data: %d blobs of %d features is too large", n, features)
	}
	rng := rand.New(rand.NewPCG(seed, 0xb10b))
	centers := make([]float32, classes*features)
	for i := range centers {
		centers[i] = float32(2 * rng.NormFloat64())
	}
	x := make([]float32, n*features)
	y := make([]int, n)
	for i := range y {
		c := i % classes
		y[i] = c
		for f := range features {
			x[i*features+f] = centers[c*features+f] + float32(rng.NormFloat64())
		}
	}
	return &Dataset{X: tensor.FromSlice(x, n, features), Y: y}, nil
}
