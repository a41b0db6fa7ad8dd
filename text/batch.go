package text

import (
	"fmt"
	"iter"
	"math/rand/v2"

	"github.com/skyhive/skyhive/tensor"
)

// Batch is a mini-batch for causal language modelling. X holds the input
// token ids and Y the targets, both [batch, seq] float32 tensors of
// integral ids (the form nn.Embedding takes); Y[b][s] is the token that
// follows X[b][s] in the corpus. Start holds the corpus offset of each
// row's first token.
type Batch struct {
	X, Y  *tensor.Tensor
	Start []int
}

// Labels returns the targets as the flat []int that
// nn.SoftmaxCrossEntropy takes for logits of shape [batch*seq, vocab].
func (b Batch) Labels() []int {
	l := make([]int, len(b.Y.Data))
	for i, v := range b.Y.Data {
		l[i] = int(v)
	}
	return l
}

// Sampler draws random training windows from a token stream. It is not
// safe for concurrent use.
type Sampler struct {
	tokens     []int32
	batch, seq int
	rng        *rand.Rand
}

// NewSampler returns a Sampler of [batch, seq] windows over tokens, whose
// draws depend only on seed. tokens must hold at least seq+1 ids, all in
// [0, MaxVocab).
func NewSampler(tokens []int32, batch, seq int, seed uint64) (*Sampler, error) {
	if err := checkWindows(tokens, batch, seq); err != nil {
		return nil, err
	}
	return &Sampler{tokens: tokens, batch: batch, seq: seq, rng: rand.New(rand.NewPCG(seed, 0xba7c))}, nil
}

// Next returns the next batch: each row starts at a position drawn
// uniformly from the windows that fit, so every token can be an input.
func (s *Sampler) Next() Batch {
	starts := make([]int, s.batch)
	for i := range starts {
		starts[i] = s.rng.IntN(len(s.tokens) - s.seq)
	}
	return gather(s.tokens, starts, s.seq)
}

// Windows yields the corpus as consecutive, non-overlapping windows of seq
// tokens in order, batch rows at a time (the last batch may have fewer
// rows), for evaluation: every token but the first is a target exactly
// once, except a tail shorter than seq.
func Windows(tokens []int32, batch, seq int) (iter.Seq[Batch], error) {
	if err := checkWindows(tokens, batch, seq); err != nil {
		return nil, err
	}
	return func(yield func(Batch) bool) {
		rows := (len(tokens) - 1) / seq
		for r := 0; r < rows; r += batch {
			starts := make([]int, min(batch, rows-r))
			for i := range starts {
				starts[i] = (r + i) * seq
			}
			if !yield(gather(tokens, starts, seq)) {
				return
			}
		}
	}, nil
}

// checkWindows validates the arguments of NewSampler and Windows.
func checkWindows(tokens []int32, batch, seq int) error {
	if batch < 1 || seq < 1 {
		return fmt.Errorf("text: batch %d and sequence length %d must be positive", batch, seq)
	}
	if len(tokens) < seq+1 {
		return fmt.Errorf("text: %d tokens are too few for windows of %d tokens and their targets: %w", len(tokens), seq, ErrEmpty)
	}
	return checkIDs(tokens, MaxVocab)
}

// gather copies the windows that start at starts into a Batch.
func gather(tokens []int32, starts []int, seq int) Batch {
	x := make([]float32, len(starts)*seq)
	y := make([]float32, len(starts)*seq)
	for i, st := range starts {
		for k := range seq {
			x[i*seq+k] = float32(tokens[st+k])
			y[i*seq+k] = float32(tokens[st+k+1])
		}
	}
	return Batch{
		X:     tensor.FromSlice(x, len(starts), seq),
		Y:     tensor.FromSlice(y, len(starts), seq),
		Start: starts,
	}
}
