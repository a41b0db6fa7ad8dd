//go:build amd64 && !noasm

package tensor

// expAVX2 sets dst[i] = e**src[i] for i < n, n a multiple of 8, with AVX2
// and FMA (exp_amd64.s).
//
//go:noescape
func expAVX2(dst, src *float32, n int)

// expSlice sets dst[i] = e**x[i] for i < len(dst); len(x) >= len(dst).
func expSlice(dst, x []float32) {
	n := len(dst)
	x = x[:n]
	if v := n &^ 7; v > 0 && hasAVX2() {
		expAVX2(&dst[0], &x[0], v)
		dst, x = dst[v:], x[v:]
	}
	for i, v := range x {
		dst[i] = exp32(v)
	}
}
