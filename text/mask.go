package text

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"

	"github.com/skyhive/skyhive/tensor"
)

// IgnoreLabel is the label Masking.Apply gives the positions a masked
// language model is not asked to predict. It equals nn.IgnoreLabel, the
// label nn.MaskedSequenceCrossEntropy leaves out (package text does not
// import package nn).
const IgnoreLabel = -1

// Masking is BERT's recipe for the inputs of a masked language model
// (Devlin et al. 2019, section 3.1): in each sequence a fraction Rate of
// the positions is chosen for prediction; a chosen position's token is
// replaced by [MASK] with probability MaskProb, by a token drawn uniformly
// from [0, Vocab) with probability RandomProb (which may draw the original
// token), and left unchanged otherwise. The model must predict the original
// token at every chosen position, whichever of the three happened, and
// nothing elsewhere. The JSON form is what a masked language model's
// checkpoint records ("skyhive.masking").
type Masking struct {
	// MaskID is the [MASK] token's id. It must lie outside [0, Vocab), so
	// that no original or random token is [MASK].
	MaskID int32 `json:"mask_id"`
	// Vocab is the vocabulary of the data: every original id is below it,
	// and random replacements are drawn from [0, Vocab).
	Vocab int `json:"vocab"`
	// Rate is the fraction of each sequence's positions chosen (0.15).
	Rate float64 `json:"rate"`
	// MaskProb and RandomProb are the probabilities that a chosen position
	// becomes [MASK] (0.8) or a random token (0.1).
	MaskProb   float64 `json:"mask"`
	RandomProb float64 `json:"random"`
}

// BERTMasking is BERT's recipe: 15% of the positions chosen, of those 80%
// replaced by maskID, 10% by a random token of [0, vocab) and 10% left as
// they are.
func BERTMasking(maskID int32, vocab int) Masking {
	return Masking{MaskID: maskID, Vocab: vocab, Rate: 0.15, MaskProb: 0.8, RandomProb: 0.1}
}

// Validate reports a recipe Apply cannot follow.
func (m Masking) Validate() error {
	switch {
	case m.Vocab < 1 || m.Vocab > MaxVocab:
		return fmt.Errorf("text: masking vocabulary %d outside [1, %d]", m.Vocab, MaxVocab)
	case m.MaskID < 0 || int(m.MaskID) >= MaxVocab:
		return fmt.Errorf("text: [MASK] id %d outside [0, %d)", m.MaskID, MaxVocab)
	case int(m.MaskID) < m.Vocab:
		return fmt.Errorf("text: [MASK] id %d is inside the data's vocabulary of %d; give it an id of its own, e.g. %d", m.MaskID, m.Vocab, m.Vocab)
	case !(m.Rate > 0 && m.Rate <= 1):
		return fmt.Errorf("text: masking rate %v outside (0, 1]", m.Rate)
	case !(m.MaskProb >= 0 && m.RandomProb >= 0 && m.MaskProb+m.RandomProb <= 1):
		return fmt.Errorf("text: masking probabilities %v ([MASK]) and %v (random) must be non-negative with a sum of at most 1", m.MaskProb, m.RandomProb)
	}
	return nil
}

// Chosen returns how many of a sequence's n positions Apply chooses:
// round(Rate·n), but at least one and at most n.
func (m Masking) Chosen(n int) int {
	return min(n, max(1, int(math.Round(m.Rate*float64(n)))))
}

// Apply masks every row of ids, [batch, seq] float32 token ids as Sampler
// and Windows give them, drawing from rng alone: the same ids, recipe and
// generator state give the same result. In each row it chooses
// Chosen(seq) distinct positions uniformly, then treats each chosen
// position as the recipe says. It returns the model's input, a new
// [batch, seq] tensor (ids is not modified), and the labels, batch·seq
// row-major as nn.MaskedSequenceCrossEntropy takes them: the original id
// at each chosen position and IgnoreLabel elsewhere. It returns an error
// for an invalid recipe, a shape other than [batch ≥ 1, seq ≥ 1], or an id
// that is not an integer in [0, Vocab).
func (m Masking) Apply(ids *tensor.Tensor, rng *rand.Rand) (*tensor.Tensor, []int, error) {
	if err := m.Validate(); err != nil {
		return nil, nil, err
	}
	if len(ids.Shape) != 2 || ids.Shape[0] < 1 || ids.Shape[1] < 1 || ids.Len() != ids.Shape[0]*ids.Shape[1] {
		return nil, nil, fmt.Errorf("text: masking token ids of shape %v, want [batch, seq]", ids.Shape)
	}
	if rng == nil {
		return nil, nil, errors.New("text: masking needs a seeded generator")
	}
	batch, seq := ids.Shape[0], ids.Shape[1]
	for i, v := range ids.Data {
		if !(v >= 0 && v < float32(m.Vocab)) || v != float32(int(v)) {
			return nil, nil, fmt.Errorf("text: token id %v at row %d position %d is not an integer in [0, %d)", v, i/seq, i%seq, m.Vocab)
		}
	}
	x := ids.Clone()
	labels := make([]int, batch*seq)
	for i := range labels {
		labels[i] = IgnoreLabel
	}
	k := m.Chosen(seq)
	perm := make([]int, seq)
	for b := range batch {
		row := x.Data[b*seq : (b+1)*seq]
		for i := range perm {
			perm[i] = i
		}
		// A partial Fisher–Yates shuffle: perm[:k] is a uniform draw of k
		// distinct positions.
		for i := range k {
			j := i + rng.IntN(seq-i)
			perm[i], perm[j] = perm[j], perm[i]
		}
		for _, p := range perm[:k] {
			labels[b*seq+p] = int(row[p])
			switch u := rng.Float64(); {
			case u < m.MaskProb:
				row[p] = float32(m.MaskID)
			case u < m.MaskProb+m.RandomProb:
				row[p] = float32(rng.IntN(m.Vocab))
			}
		}
	}
	return x, labels, nil
}
