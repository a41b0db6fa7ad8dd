package bridge

import (
	"errors"
	"math"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/skyhive/skyhive/moe/server"
	"github.com/skyhive/skyhive/nn"
	"github.com/skyhive/skyhive/optim"
	"github.com/skyhive/skyhive/tensor"
)

// testPython is the interpreter of the tests: $SKYHIVE_PYTHON, else
// Debian's /usr/bin/python3 (whose python3-torch scripts/setup.sh
// installs), else python3 on PATH.
func testPython() string {
	if p := os.Getenv("SKYHIVE_PYTHON"); p != "" {
		return p
	}
	if _, err := os.Stat("/usr/bin/python3"); err == nil {
		return "/usr/bin/python3"
	}
	return "python3"
}

// needTorch skips a test when the interpreter cannot import torch.
func needTorch(t *testing.T) {
	t.Helper()
	if testing.Short() {
		t.Skip("starts a PyTorch executor")
	}
	if err := exec.Command(testPython(), "-c", "import torch").Run(); err != nil {
		t.Skipf("%s cannot import torch (%v): install python3-torch", testPython(), err)
	}
}

// testExecutor starts an executor over the test modules in python/tests.
func testExecutor(t *testing.T, module string, callTimeout time.Duration, elements int) *Executor {
	t.Helper()
	py, err := filepath.Abs("../python")
	if err != nil {
		t.Fatal(err)
	}
	ex, err := StartExecutor(t.Context(), ExecutorConfig{
		Module: module, Python: testPython(), Device: "cpu", Elements: elements, WeightDecay: 0.01,
		CallTimeout: callTimeout,
		Env:         []string{"PYTHONPATH=" + py + ":" + filepath.Join(py, "tests")},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ex.Close() })
	return ex
}

// torchNames maps the Go expert's parameters to the PyTorch FFN's
// (python/tests/experts.py), transposing the linear layers' weights.
func torchNames(goParams map[string]*tensor.Tensor) map[string]*tensor.Tensor {
	out := map[string]*tensor.Tensor{}
	for name, v := range goParams {
		name = strings.NewReplacer("gamma", "weight", "beta", "bias").Replace(name)
		if len(v.Shape) == 2 {
			tr := tensor.New(v.Shape[1], v.Shape[0])
			tensor.Transpose2D(tr.Data, v.Data, v.Shape[0], v.Shape[1])
			v = tr
		}
		out[name] = v
		out["opt/"+name+".exp_avg"] = tensor.New(v.Shape...)
		out["opt/"+name+".exp_avg_sq"] = tensor.New(v.Shape...)
	}
	return out
}

func closeTo(t *testing.T, what string, got, want []float32, tol float64) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%s: %d values, want %d", what, len(got), len(want))
	}
	for i := range got {
		if d := math.Abs(float64(got[i] - want[i])); d > tol*(1+math.Abs(float64(want[i]))) {
			t.Fatalf("%s[%d] = %g, want %g", what, i, got[i], want[i])
		}
	}
}

// The server computes experts with a bridge.Executor.
var _ server.RoleExecutor = (*Executor)(nil)

// TestExecutorMatchesGoExpert runs Skyhive's Go FFN expert and the same
// expert in PyTorch, behind the executor, from the same weights: forward,
// backward and one AdamW step agree within float32 tolerance.
func TestExecutorMatchesGoExpert(t *testing.T) {
	needTorch(t)
	ex := testExecutor(t, "experts:make_ffn", 0, 1<<16)
	const hidden, rows = 16, 5
	n, err := ex.Build(t.Context(), "ffn.0", hidden, 1)
	if err != nil {
		t.Fatal(err)
	}
	if want := int64(8*hidden*hidden + 7*hidden); n != want {
		t.Fatalf("module of %d parameters, want %d", n, want)
	}
	rng := rand.New(rand.NewPCG(1, 2))
	goExpert := nn.NewExpert(hidden, rng)
	for _, p := range goExpert.Params() { // non-trivial LayerNorm and biases
		for i := range p.Value.Data {
			p.Value.Data[i] += float32(rng.NormFloat64() * 0.1)
		}
	}
	if err := ex.Load(t.Context(), "ffn.0", torchNames(nn.ExportParams(goExpert.Params())), 0); err != nil {
		t.Fatal(err)
	}
	x, dy := tensor.New(rows, hidden), tensor.New(rows, hidden)
	for i := range x.Data {
		x.Data[i], dy.Data[i] = float32(rng.NormFloat64()), float32(rng.NormFloat64())
	}

	y, err := ex.Forward(t.Context(), "ffn.0", x)
	if err != nil {
		t.Fatal(err)
	}
	want, _ := goExpert.Forward(nn.Ctx{}, x)
	closeTo(t, "y", y.Data, want.Data, 1e-5)

	opt := optim.NewAdamW(goExpert.Params(), optim.AdamWConfig{LR: 1e-3, WeightDecay: 0.01, NoDecay: optim.NoDecayVectors})
	opt.ZeroGrad()
	_, st := goExpert.Forward(nn.Ctx{Train: true}, x)
	wantDX := goExpert.Backward(st, dy)
	opt.Step()
	dx, norm, stepped, err := ex.Backward(t.Context(), "ffn.0", x, dy, true, 1, 0)
	if err != nil {
		t.Fatal(err)
	}
	closeTo(t, "dx", dx.Data, wantDX.Data, 1e-5)
	if !stepped || !(norm > 0) {
		t.Fatalf("backward: stepped %v, norm %v; want a step with a positive norm", stepped, norm)
	}
	state, step, err := ex.State(t.Context(), "ffn.0")
	if err != nil {
		t.Fatal(err)
	}
	if step != 1 {
		t.Fatalf("step %d after one optimizer step", step)
	}
	for name, v := range torchNames(nn.ExportParams(goExpert.Params())) {
		if strings.HasPrefix(name, "opt/") {
			continue
		}
		closeTo(t, name, state[name].Data, v.Data, 1e-5)
	}
	if s := ex.Stats(); s.Calls != 2 || s.ComputeSeconds <= 0 || s.ComputeSeconds > s.Seconds {
		t.Fatalf("stats %+v", s)
	}
}

// TestExecutorFaults: a module that returns the wrong shape or raises
// fails its call and the executor goes on; NaN comes back for the role to
// refuse; one that hangs is killed after CallTimeout and one that kills
// its process is reported with its exit; a module path that does not
// import fails the start with what to fix.
func TestExecutorFaults(t *testing.T) {
	needTorch(t)
	ctx := t.Context()
	ex := testExecutor(t, "experts:make_faulty", 3*time.Second, 1<<16)
	for _, h := range []int{2, 3, 5, 7} {
		if _, err := ex.Build(ctx, map[int]string{2: "good", 3: "shape", 5: "nan", 7: "hang"}[h], h, 1); err != nil {
			t.Fatal(err)
		}
	}
	var ee *ExecutorError
	if _, err := ex.Forward(ctx, "shape", tensor.New(4, 3)); !errors.As(err, &ee) || ee.Kind != "module" || !strings.Contains(err.Error(), "shape") {
		t.Fatalf("wrong shape: %v", err)
	}
	if _, _, _, err := ex.Backward(ctx, "good", tensor.New(4, 3), tensor.New(4, 3), true, 1, 0); !errors.As(err, &ee) || ee.Kind != "module" {
		t.Fatalf("input of another size: %v", err) // the Linear raises
	}
	if _, err := ex.Forward(ctx, "missing", tensor.New(1, 2)); !errors.As(err, &ee) || ee.Kind != "protocol" {
		t.Fatalf("unknown expert: %v", err)
	}
	y, err := ex.Forward(ctx, "nan", tensor.New(2, 5))
	if err != nil || !math.IsNaN(float64(y.Data[0])) {
		t.Fatalf("NaN module: %v %v", y, err)
	}
	if _, err := ex.Forward(ctx, "good", tensor.New(2, 2)); err != nil {
		t.Fatalf("after failed calls: %v", err)
	}
	start := time.Now()
	_, err = ex.Forward(ctx, "hang", tensor.New(1, 7))
	if !errors.Is(err, ErrExecutorGone) || !strings.Contains(err.Error(), "hangs") {
		t.Fatalf("hanging module: %v", err)
	}
	if d := time.Since(start); d > 20*time.Second {
		t.Fatalf("the hang was noticed after %v", d)
	}
	if _, err := ex.Forward(ctx, "good", tensor.New(2, 2)); !errors.Is(err, ErrExecutorGone) {
		t.Fatalf("call after the kill: %v", err)
	}

	crash := testExecutor(t, "experts:make_faulty", 0, 1<<16)
	if _, err := crash.Build(ctx, "crash", 9, 1); err != nil {
		t.Fatal(err)
	}
	if _, err := crash.Forward(ctx, "crash", tensor.New(1, 9)); !errors.Is(err, ErrExecutorGone) || !strings.Contains(err.Error(), "exit status 3") {
		t.Fatalf("crashing module: %v", err)
	}
	select {
	case <-crash.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("Done not closed after the crash")
	}

	for module, want := range map[string]string{
		"nosuchpkg.experts:make": "cannot import nosuchpkg.experts",
		"experts:nothing":        "has no nothing",
		"experts":                "want package.module:function",
	} {
		_, err := StartExecutor(ctx, ExecutorConfig{Module: module, Python: testPython(), Device: "cpu", Elements: 16,
			Env: []string{"PYTHONPATH=../python:../python/tests"}})
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Fatalf("module %s: %v, want %q", module, err, want)
		}
	}
	bad := testExecutor(t, "experts:not_a_module", 0, 1<<16)
	if _, err := bad.Build(ctx, "x", 4, 1); err == nil || !strings.Contains(err.Error(), "not a torch.nn.Module") {
		t.Fatalf("function returning an int: %v", err)
	}
}
