package nn

import (
	"fmt"
	"math"

	"github.com/skyhive/skyhive/tensor"
)

// SoftmaxCrossEntropy returns the mean over the batch of −log softmax(logits)
// at each label, and its gradient with respect to logits ([N, C]):
// (softmax − onehot)/N. Labels must be in [0, C).
func SoftmaxCrossEntropy(logits *tensor.Tensor, labels []int) (float32, *tensor.Tensor) {
	if len(logits.Shape) != 2 || logits.Shape[0] != len(labels) {
		panic(fmt.Sprintf("nn: SoftmaxCrossEntropy: logits %v for %d labels", logits.Shape, len(labels)))
	}
	n, c := logits.Shape[0], logits.Shape[1]
	for _, lab := range labels {
		if lab < 0 || lab >= c {
			panic(fmt.Sprintf("nn: SoftmaxCrossEntropy: label %d outside [0, %d)", lab, c))
		}
	}
	d := tensor.New(n, c)
	rowLoss := make([]float64, n)
	inv := 1 / float32(n)
	// Rows are independent: each goroutine takes a range, and the losses
	// are summed in row order afterwards, so the result does not depend on
	// the split.
	parallelFor(n, rowGrain(c), func(lo, hi int) {
		for i := lo; i < hi; i++ {
			lab := labels[i]
			row := logits.Data[i*c : (i+1)*c]
			dr := d.Data[i*c : (i+1)*c]
			mx := row[0]
			for _, v := range row {
				mx = max(mx, v)
			}
			for j, v := range row {
				dr[j] = v - mx
			}
			tensor.Exp(dr, dr)
			var s float64
			for _, e := range dr {
				s += float64(e)
			}
			rowLoss[i] = math.Log(s) - float64(row[lab]-mx)
			tensor.Scale(float32(float64(inv)/s), dr)
			dr[lab] -= inv
		}
	})
	var loss float64
	for _, l := range rowLoss {
		loss += l
	}
	return float32(loss / float64(n)), d
}

// SequenceCrossEntropy is the causal language-model loss: the mean over all
// batch·seq positions of −log softmax(logits) at each position's target,
// for logits [batch, seq, vocab] and targets of length batch·seq (row-major,
// targets[b·seq+t] is the token that follows position t of sequence b; see
// NextTokenTargets). The gradient has the shape of logits. It is
// SoftmaxCrossEntropy over the flattened positions, so every position
// weighs the same whatever the batch and sequence sizes.
func SequenceCrossEntropy(logits *tensor.Tensor, targets []int) (float32, *tensor.Tensor) {
	if len(logits.Shape) != 3 || logits.Shape[0]*logits.Shape[1] != len(targets) {
		panic(fmt.Sprintf("nn: SequenceCrossEntropy: logits %v for %d targets", logits.Shape, len(targets)))
	}
	b, s, v := logits.Shape[0], logits.Shape[1], logits.Shape[2]
	loss, d := SoftmaxCrossEntropy(logits.Reshape(b*s, v), targets)
	return loss, d.Reshape(b, s, v)
}

// IgnoreLabel is the target of a position that MaskedSequenceCrossEntropy
// leaves out: in masked language modelling, every position that was not
// chosen for prediction (package text's masking writes the same value).
const IgnoreLabel = -1

// MaskedSequenceCrossEntropy is the masked language model's loss: the mean
// of −log softmax(logits) at the target over the positions whose target is
// not IgnoreLabel, for logits [batch, seq, vocab] and targets of length
// batch·seq (row-major). It returns the loss, its gradient with respect to
// logits (zero at every ignored position) and the number n of positions
// counted. With n = 0 the loss is 0 and the gradient zero. Targets other
// than IgnoreLabel must be in [0, vocab). Only the counted rows go through
// the softmax, so the cost grows with n, not with batch·seq.
func MaskedSequenceCrossEntropy(logits *tensor.Tensor, targets []int) (loss float32, d *tensor.Tensor, n int) {
	if len(logits.Shape) != 3 || logits.Shape[0]*logits.Shape[1] != len(targets) || logits.Len() != len(targets)*logits.Shape[2] {
		panic(fmt.Sprintf("nn: MaskedSequenceCrossEntropy: logits %v for %d targets", logits.Shape, len(targets)))
	}
	v := logits.Shape[2]
	var rows []int
	var labels []int
	for i, t := range targets {
		if t != IgnoreLabel {
			rows = append(rows, i)
			labels = append(labels, t)
		}
	}
	d = tensor.New(logits.Shape...)
	if len(rows) == 0 {
		return 0, d, 0
	}
	picked := tensor.New(len(rows), v)
	for k, i := range rows {
		copy(picked.Data[k*v:(k+1)*v], logits.Data[i*v:(i+1)*v])
	}
	loss, dp := SoftmaxCrossEntropy(picked, labels)
	for k, i := range rows {
		copy(d.Data[i*v:(i+1)*v], dp.Data[k*v:(k+1)*v])
	}
	return loss, d, len(rows)
}

// NextTokenTargets splits windows of seq+1 token ids ([batch, seq+1],
// float32 as Embedding takes them) into a language model's inputs (the
// first seq tokens of each window, [batch, seq]) and targets (the last seq
// tokens, flattened as SequenceCrossEntropy takes them). It returns an error
// if the shape is not [batch ≥ 1, seq+1 ≥ 2] or an id is not an integer in
// [0, vocab), so data read from outside is checked before Embedding (which
// panics on a bad id) sees it.
func NextTokenTargets(windows *tensor.Tensor, vocab int) (*tensor.Tensor, []int, error) {
	if len(windows.Shape) != 2 || windows.Shape[0] < 1 || windows.Shape[1] < 2 || windows.Len() != windows.Shape[0]*windows.Shape[1] {
		return nil, nil, fmt.Errorf("nn: token windows have shape %v, want [batch, seq+1] with seq ≥ 1", windows.Shape)
	}
	b, w := windows.Shape[0], windows.Shape[1]
	s := w - 1
	x := tensor.New(b, s)
	y := make([]int, b*s)
	for i := 0; i < b; i++ {
		row := windows.Data[i*w : (i+1)*w]
		for j, v := range row {
			if !(v >= 0 && v < float32(vocab)) || v != float32(int(v)) {
				return nil, nil, fmt.Errorf("nn: token id %v at window %d position %d is not an integer in [0, %d)", v, i, j, vocab)
			}
		}
		copy(x.Data[i*s:(i+1)*s], row[:s])
		for j, v := range row[1:] {
			y[i*s+j] = int(v)
		}
	}
	return x, y, nil
}

// Argmax returns the index of the largest value in each row of a [N, C]
// tensor.
func Argmax(x *tensor.Tensor) []int {
	n, c := x.Shape[0], x.Shape[1]
	out := make([]int, n)
	for i := range out {
		row := x.Data[i*c : (i+1)*c]
		best := 0
		for j, v := range row {
			if v > row[best] {
				best = j
			}
		}
		out[i] = best
	}
	return out
}

// Accuracy returns the fraction of rows of logits whose argmax equals the
// label.
func Accuracy(logits *tensor.Tensor, labels []int) float64 {
	if len(labels) == 0 {
		return 0
	}
	hit := 0
	for i, p := range Argmax(logits) {
		if p == labels[i] {
			hit++
		}
	}
	return float64(hit) / float64(len(labels))
}
