package nn

import (
	"math"

	"github.com/skyhive/skyhive/tensor"
)

// Row-wise kernels that package tensor does not provide in the form the
// layers need. They work on flat slices holding rows×cols row-major matrices
// and never allocate.

// accColSums adds the column sums of x (rows×cols) into dst (length cols);
// unlike tensor.ColSums it accumulates, as parameter gradients must.
func accColSums(dst, x []float32, rows, cols int) {
	for r := 0; r < rows; r++ {
		tensor.Add(dst, dst, x[r*cols:(r+1)*cols])
	}
}

// softmaxRowsMasked replaces each row of x (rows×cols) by its softmax over
// the columns j with keep[j] != 0 and, if causal, j ≤ the row index; other
// columns become 0. A row whose columns are all masked becomes all zeros
// (tensor.SoftmaxRows would give NaN). keep may be nil (no padding mask).
func softmaxRowsMasked(x []float32, rows, cols int, keep []float32, causal bool) {
	if keep == nil && !causal {
		tensor.SoftmaxRows(x, rows, cols)
		return
	}
	for r := 0; r < rows; r++ {
		row := x[r*cols : (r+1)*cols]
		k := keep
		if causal {
			n := min(r+1, cols)
			clear(row[n:])
			row = row[:n]
			if k != nil {
				k = k[:n]
			}
		}
		if k == nil {
			tensor.SoftmaxRows(row, 1, len(row))
			continue
		}
		mx := float32(math.Inf(-1))
		for j, v := range row {
			if k[j] != 0 && v > mx {
				mx = v
			}
		}
		if math.IsInf(float64(mx), -1) {
			clear(row)
			continue
		}
		tensor.AddScalar(-mx, row)
		tensor.Exp(row, row)
		for j, kj := range k {
			if kj == 0 {
				row[j] = 0
			}
		}
		tensor.Scale(1/tensor.Sum(row), row)
	}
}

// softmaxBackwardRows overwrites dp with the gradient with respect to the
// softmax input: ds = p ⊙ (dp − Σ_j dp_j p_j), row by row.
func softmaxBackwardRows(dp, p []float32, rows, cols int) {
	for r := 0; r < rows; r++ {
		pr := p[r*cols : (r+1)*cols]
		dr := dp[r*cols : (r+1)*cols]
		tensor.AddScalar(-tensor.Dot(dr, pr), dr)
		tensor.Mul(dr, dr, pr)
	}
}
