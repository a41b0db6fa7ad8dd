package alloc

import (
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// writePaperMILP writes the MILP of the reference code
// (scaelum/dynamics/allocator.py, optimal_allocate) in CPLEX LP format:
// x[i][j] = layer j on device i, y[i]/z[i] the last/first layer index of
// device i, q the bottleneck. Times are in seconds, memory in GB.
func writePaperMILP(path string, p Problem) error {
	in, err := compile(p)
	if err != nil {
		return err
	}
	D, L := in.n, in.L
	var b strings.Builder
	b.WriteString("Minimize\n obj: q\nSubject To\n")
	for i := 0; i < D; i++ {
		fmt.Fprintf(&b, " mem%d:", i)
		for j := 0; j < L; j++ {
			fmt.Fprintf(&b, " + %.12g x%d_%d", float64(in.mem[j+1]-in.mem[j])/1e9, i, j)
		}
		fmt.Fprintf(&b, " <= %.12g\n", float64(in.cap[i])/1e9)
		for j := 0; j < L; j++ {
			fmt.Fprintf(&b, " ymax%d_%d: y%d - %d x%d_%d >= 0\n", i, j, i, j, i, j)
			fmt.Fprintf(&b, " zmin%d_%d: z%d + %d x%d_%d <= %d\n", i, j, i, L+1-j, i, j, L+1)
		}
		fmt.Fprintf(&b, " cont%d: y%d - z%d", i, i, i)
		for j := 0; j < L; j++ {
			fmt.Fprintf(&b, " - x%d_%d", i, j)
		}
		b.WriteString(" <= -1\n")
		fmt.Fprintf(&b, " bot%d: q", i)
		for j := 0; j < L; j++ {
			fmt.Fprintf(&b, " - %.12g x%d_%d", in.stageTime(i, j, j+1), i, j)
		}
		b.WriteString(" >= 0\n")
	}
	for j := 0; j < L; j++ {
		fmt.Fprintf(&b, " one%d:", j)
		for i := 0; i < D; i++ {
			fmt.Fprintf(&b, " + x%d_%d", i, j)
		}
		b.WriteString(" = 1\n")
	}
	b.WriteString("Bounds\n")
	for i := 0; i < D; i++ {
		fmt.Fprintf(&b, " 0 <= y%d <= %d\n 0 <= z%d <= %d\n", i, L, i, L)
	}
	b.WriteString("Binary\n")
	for i := 0; i < D; i++ {
		for j := 0; j < L; j++ {
			fmt.Fprintf(&b, " x%d_%d\n", i, j)
		}
	}
	b.WriteString("End\n")
	return os.WriteFile(path, []byte(b.String()), 0o644)
}

// TestOptimalVsCBC checks the exact solver against an independent MILP
// solver (Debian package coinor-cbc) on the paper's own formulation.
func TestOptimalVsCBC(t *testing.T) {
	cbc, err := exec.LookPath("cbc")
	if err != nil {
		t.Skip("cbc not installed (apt-get install coinor-cbc)")
	}
	dir := t.TempDir()
	n, matched := 8, 0
	if testing.Short() {
		n = 3
	}
	for seed := uint64(100); seed < uint64(100+n); seed++ {
		p := randomProblem(seed, 3+int(seed%3), 6+int(seed%5), 1, true)
		p.Objective = ObjBottleneck
		lp := filepath.Join(dir, fmt.Sprintf("m%d.lp", seed))
		sol := filepath.Join(dir, fmt.Sprintf("m%d.sol", seed))
		if err := writePaperMILP(lp, p); err != nil {
			t.Fatal(err)
		}
		out, err := exec.Command(cbc, lp, "ratioGap", "0", "allowableGap", "1e-9", "solve", "solu", sol).CombinedOutput()
		if err != nil {
			t.Fatalf("cbc: %v\n%s", err, out)
		}
		data, err := os.ReadFile(sol)
		if err != nil {
			t.Fatal(err)
		}
		first, _, _ := strings.Cut(string(data), "\n")
		r, oerr := Solve(context.Background(), "optimal", p)
		if strings.HasPrefix(first, "Infeasible") {
			if !errors.Is(oerr, ErrInfeasible) {
				t.Errorf("seed %d: cbc infeasible, optimal: %v", seed, oerr)
			}
			continue
		}
		if !strings.HasPrefix(first, "Optimal") {
			t.Fatalf("seed %d: cbc: %q", seed, first)
		}
		f := strings.Fields(first)
		want, err := strconv.ParseFloat(f[len(f)-1], 64)
		if err != nil {
			t.Fatalf("cbc objective %q: %v", first, err)
		}
		if oerr != nil {
			t.Fatalf("seed %d: %v", seed, oerr)
		}
		if math.Abs(r.Predicted-want) > 1e-6*want || !r.Proven {
			t.Errorf("seed %d: optimal %.9g (proven %v), cbc %.9g", seed, r.Predicted, r.Proven, want)
		}
		matched++
	}
	if matched < n/2 {
		t.Errorf("only %d of %d instances were feasible", matched, n)
	}
	t.Logf("%d instances agree with cbc", matched)
}
