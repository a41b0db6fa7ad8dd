//go:build !amd64 || noasm

package tensor

// expSlice sets dst[i] = e**x[i] for i < len(dst); len(x) >= len(dst).
func expSlice(dst, x []float32) {
	x = x[:len(dst)]
	for i, v := range x {
		dst[i] = exp32(v)
	}
}
