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
	d := tensor.New(n, c)
	var loss float64
	inv := 1 / float32(n)
	for i, lab := range labels {
		if lab < 0 || lab >= c {
			panic(fmt.Sprintf("nn: SoftmaxCrossEntropy: label %d outside [0, %d)", lab, c))
		}
		row := logits.Data[i*c : (i+1)*c]
		dr := d.Data[i*c : (i+1)*c]
		mx := row[0]
		for _, v := range row {
			mx = max(mx, v)
		}
		var s float64
		for j, v := range row {
			e := math.Exp(float64(v - mx))
			dr[j] = float32(e)
			s += e
		}
		loss += math.Log(s) - float64(row[lab]-mx)
		for j := range dr {
			dr[j] = dr[j] / float32(s) * inv
		}
		dr[lab] -= inv
	}
	return float32(loss / float64(n)), d
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
