package tensor

import (
	"runtime"
	"sync"
	"sync/atomic"
)

// The pure-Go GEMM follows the Goto/BLIS scheme. For every block of kc
// columns of op(A) (rows of op(B)), op(B) is packed into column panels of nr
// values per row, shared by all workers. C is then cut into tasks of mc rows
// by a range of B panels; a worker packs its mc×kc block of op(A) (scaled by
// alpha) into row panels of mr values per column and runs the micro-kernel
// on every mr×nr tile. The micro-kernel always adds into C, so C is scaled
// by beta once up front.

// microKernel computes C[0:mr, 0:nr] += Ap·Bp, where ap holds k columns of
// mr values (ap[p*mr+i]) and bp holds k rows of nr values with stride ldb
// (bp[p*ldb+j]); C starts at c[0] with row stride ldc. k is at least 1 and
// all of the tile lies inside c.
type microKernel func(k int, ap, bp []float32, ldb int, c []float32, ldc int)

// goGemm is a configured pure-Go GEMM: a micro-kernel with its tile shape
// and the cache block sizes. Its zero value is not usable; see newGoGemm.
type goGemm struct {
	name   string
	mr, nr int
	kernel microKernel
	kc, mc int
	// minParallelFlops is the size (2·m·n·k) below which one goroutine
	// does all the work.
	minParallelFlops int
	// bufs recycles packing buffers (*[]float32) between calls.
	bufs sync.Pool
}

// getBuf returns a buffer with at least n elements from the pool.
func (g *goGemm) getBuf(n int) *[]float32 {
	if p, ok := g.bufs.Get().(*[]float32); ok && cap(*p) >= n {
		*p = (*p)[:n]
		return p
	}
	s := make([]float32, n)
	return &s
}

// gemm implements Gemm (arguments already validated) with the pure-Go
// kernels.
func (g *goGemm) gemm(transA, transB bool, m, n, k int, alpha float32, a []float32, lda int, b []float32, ldb int, beta float32, c []float32, ldc int) {
	if m == 0 || n == 0 {
		return
	}
	scaleC(m, n, beta, c, ldc)
	if k == 0 || alpha == 0 {
		return
	}
	mr, nr := g.mr, g.nr
	nPanels := (n + nr - 1) / nr
	mc := min(g.mc, roundUp(m, mr))
	mBlocks := (m + mc - 1) / mc

	workers := runtime.GOMAXPROCS(0)
	if 2*m*n*k < g.minParallelFlops {
		workers = 1
	}
	// Split columns too, so that there are a few tasks per worker even when
	// m is small; each chunk keeps at least 4 panels so that repacking A per
	// task stays cheap.
	nChunks := 1
	if workers > 1 {
		want := (4*workers + mBlocks - 1) / mBlocks
		nChunks = max(1, min(want, nPanels/4))
	}
	panelsPerChunk := (nPanels + nChunks - 1) / nChunks
	nChunks = (nPanels + panelsPerChunk - 1) / panelsPerChunk
	tasks := mBlocks * nChunks
	workers = min(workers, tasks)

	// B is always packed, even when each of its elements is used by a
	// single block of A: reading it in place was slower, because the rows
	// of a B with a power-of-two stride all map to the same cache sets.
	kcMax := min(g.kc, k)
	bBuf := g.getBuf(kcMax * nPanels * nr)
	defer g.bufs.Put(bBuf)
	bp := *bBuf

	for pc := 0; pc < k; pc += g.kc {
		kc := min(g.kc, k-pc)
		// Pack op(B)[pc:pc+kc, :], in parallel over panels.
		packB := func(p0, p1 int) {
			for p := p0; p < p1; p++ {
				j0 := p * nr
				g.packB(bp[p*kc*nr:(p+1)*kc*nr], transB, b, ldb, pc, kc, j0, min(nr, n-j0))
			}
		}
		if workers == 1 || nPanels < 2*workers {
			packB(0, nPanels)
		} else {
			var wg sync.WaitGroup
			per := (nPanels + workers - 1) / workers
			for w := 0; w < workers; w++ {
				p0, p1 := w*per, min((w+1)*per, nPanels)
				if p0 < p1 {
					wg.Go(func() { packB(p0, p1) })
				}
			}
			wg.Wait()
		}

		var next atomic.Int64
		work := func() {
			aBuf := g.getBuf(mc * kc)
			defer g.bufs.Put(aBuf)
			ap := *aBuf
			var tile [maxTile]float32
			lastBlock := -1
			for {
				t := int(next.Add(1) - 1)
				if t >= tasks {
					return
				}
				ib, jch := t/nChunks, t%nChunks
				i0 := ib * mc
				rows := min(mc, m-i0)
				if ib != lastBlock {
					g.packA(ap, transA, alpha, a, lda, i0, rows, pc, kc)
					lastBlock = ib
				}
				p0 := jch * panelsPerChunk
				p1 := min(p0+panelsPerChunk, nPanels)
				g.macro(ap, bp, rows, kc, p0, p1, n, c[i0*ldc:], ldc, tile[:])
			}
		}
		if workers == 1 {
			work()
		} else {
			var wg sync.WaitGroup
			for w := 0; w < workers; w++ {
				wg.Go(work)
			}
			wg.Wait()
		}
	}
}

// maxTile bounds mr·nr for every micro-kernel in the package.
const maxTile = 16 * 32

// macro runs the micro-kernel over the tiles of a packed A block (rows×kc)
// and B panels [p0, p1). c points at the block's first row of C.
func (g *goGemm) macro(ap, bp []float32, rows, kc, p0, p1, n int, c []float32, ldc int, tile []float32) {
	mr, nr := g.mr, g.nr
	tile = tile[:mr*nr]
	for p := p0; p < p1; p++ {
		j0 := p * nr
		cols := min(nr, n-j0)
		bpan := bp[p*kc*nr : (p+1)*kc*nr]
		for i0 := 0; i0 < rows; i0 += mr {
			apan := ap[i0*kc : (i0+mr)*kc]
			r := min(mr, rows-i0)
			if r == mr && cols == nr {
				g.kernel(kc, apan, bpan, nr, c[i0*ldc+j0:], ldc)
				continue
			}
			// Edge tile: compute into a scratch tile, then add the part
			// that lies inside C.
			clear(tile)
			g.kernel(kc, apan, bpan, nr, tile, nr)
			for i := 0; i < r; i++ {
				Add(c[(i0+i)*ldc+j0:(i0+i)*ldc+j0+cols], c[(i0+i)*ldc+j0:], tile[i*nr:])
			}
		}
	}
}

// packA packs alpha·op(A)[i0:i0+rows, p0:p0+kc] into dst as row panels of
// mr rows: panel q holds dst[q*mr*kc + p*mr + i]. Rows past the end are
// zero.
func (g *goGemm) packA(dst []float32, trans bool, alpha float32, a []float32, lda, i0, rows, p0, kc int) {
	mr := g.mr
	for q := 0; q*mr < rows; q++ {
		pan := dst[q*mr*kc : (q+1)*mr*kc]
		r := min(mr, rows-q*mr)
		if r < mr {
			clear(pan)
		}
		base := i0 + q*mr
		if !trans {
			// op(A)[i, p] = a[i*lda+p]: rows of A are contiguous in p.
			for i := 0; i < r; i++ {
				src := a[(base+i)*lda+p0 : (base+i)*lda+p0+kc]
				for p, v := range src {
					pan[p*mr+i] = alpha * v
				}
			}
			continue
		}
		// op(A)[i, p] = a[p*lda+i]: the mr values of a column are contiguous.
		for p := 0; p < kc; p++ {
			src := a[(p0+p)*lda+base : (p0+p)*lda+base+r]
			d := pan[p*mr : p*mr+r]
			for i, v := range src {
				d[i] = alpha * v
			}
		}
	}
}

// packB packs op(B)[p0:p0+kc, j0:j0+cols] into dst (kc×nr, dst[p*nr+j]),
// zero-padding columns cols..nr-1.
func (g *goGemm) packB(dst []float32, trans bool, b []float32, ldb, p0, kc, j0, cols int) {
	nr := g.nr
	if cols < nr {
		clear(dst[:kc*nr])
	}
	if !trans {
		for p := 0; p < kc; p++ {
			copy(dst[p*nr:p*nr+cols], b[(p0+p)*ldb+j0:(p0+p)*ldb+j0+cols])
		}
		return
	}
	// op(B)[p, j] = b[j*ldb+p]: rows of B are contiguous in p.
	for j := 0; j < cols; j++ {
		src := b[(j0+j)*ldb+p0 : (j0+j)*ldb+p0+kc]
		for p, v := range src {
			dst[p*nr+j] = v
		}
	}
}

// scaleC sets C = beta·C; with beta == 0 it writes zeros without reading C,
// so NaNs in C do not propagate (as in BLAS).
func scaleC(m, n int, beta float32, c []float32, ldc int) {
	switch beta {
	case 1:
		return
	case 0:
		for i := 0; i < m; i++ {
			clear(c[i*ldc : i*ldc+n])
		}
	default:
		for i := 0; i < m; i++ {
			Scale(beta, c[i*ldc:i*ldc+n])
		}
	}
}

// roundUp rounds x up to a multiple of q.
func roundUp(x, q int) int { return (x + q - 1) / q * q }

// kernel4x4Go is the portable micro-kernel (mr = nr = 4). Sixteen scalar
// accumulators fit in the registers of amd64 and arm64.
func kernel4x4Go(k int, ap, bp []float32, ldb int, c []float32, ldc int) {
	var c00, c01, c02, c03, c10, c11, c12, c13 float32
	var c20, c21, c22, c23, c30, c31, c32, c33 float32
	ap = ap[:4*k]
	for p := 0; p < k; p++ {
		a := ap[p*4 : p*4+4 : p*4+4]
		b := bp[p*ldb : p*ldb+4 : p*ldb+4]
		a0, a1, a2, a3 := a[0], a[1], a[2], a[3]
		b0, b1, b2, b3 := b[0], b[1], b[2], b[3]
		c00 += a0 * b0
		c01 += a0 * b1
		c02 += a0 * b2
		c03 += a0 * b3
		c10 += a1 * b0
		c11 += a1 * b1
		c12 += a1 * b2
		c13 += a1 * b3
		c20 += a2 * b0
		c21 += a2 * b1
		c22 += a2 * b2
		c23 += a2 * b3
		c30 += a3 * b0
		c31 += a3 * b1
		c32 += a3 * b2
		c33 += a3 * b3
	}
	r := c[0:4:4]
	r[0] += c00
	r[1] += c01
	r[2] += c02
	r[3] += c03
	r = c[ldc : ldc+4 : ldc+4]
	r[0] += c10
	r[1] += c11
	r[2] += c12
	r[3] += c13
	r = c[2*ldc : 2*ldc+4 : 2*ldc+4]
	r[0] += c20
	r[1] += c21
	r[2] += c22
	r[3] += c23
	r = c[3*ldc : 3*ldc+4 : 3*ldc+4]
	r[0] += c30
	r[1] += c31
	r[2] += c32
	r[3] += c33
}

// newGenericGemm returns the portable configuration.
func newGenericGemm() *goGemm {
	return &goGemm{name: "go-generic", mr: 4, nr: 4, kernel: kernel4x4Go, kc: 256, mc: 64, minParallelFlops: 1 << 21}
}
