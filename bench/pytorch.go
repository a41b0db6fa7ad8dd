package bench

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
)

// pytorchSuite measures the bridge under a PyTorch loop, by running the
// Python package's benchmark (python3 -m skyhive.bench) against this
// binary: a compute-bound step with skyhive.Optimizer over the bare
// optimizer, and the rate at which tensors enter the shared memory over
// memcpy; then an expert server with a PyTorch executor against the same
// expert in Go (pytorchExpert).
func pytorchSuite() Suite {
	return Suite{
		Name: "pytorch",
		Short: "PyTorch through the daemon: step time with skyhive.Optimizer vs bare torch.optim; tensors into shared memory vs memcpy; " +
			"an expert server with a PyTorch executor vs the same expert in Go, and the bridge's share of its calls (needs python3-torch)",
		Run: runPyTorch,
	}
}

// python is the interpreter the pytorch suite runs ($SKYHIVE_PYTHON, else
// python3).
func python() string {
	if p := os.Getenv("SKYHIVE_PYTHON"); p != "" {
		return p
	}
	return "python3"
}

func runPyTorch(ctx context.Context, o Options) ([]Result, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, err
	}
	args := []string{"-m", "skyhive.bench", "--reps", strconv.Itoa(max(o.Reps, 5))}
	if o.Quick {
		args = append(args, "--quick")
	}
	cmd := exec.CommandContext(ctx, python(), args...)
	cmd.Env = append(os.Environ(), "SKYHIVE_BIN="+exe)
	// The package next to the binary's repository (bin/skyhive → python/),
	// unless it is installed.
	if dir := filepath.Join(filepath.Dir(exe), "..", "python"); isDir(filepath.Join(dir, "skyhive")) {
		cmd.Env = append(cmd.Env, "PYTHONPATH="+dir+string(os.PathListSeparator)+os.Getenv("PYTHONPATH"))
	}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		msg := strings.TrimSpace(stderr.String())
		if strings.Contains(msg, "No module named") {
			msg += "\n(the suite needs PyTorch and the skyhive package: apt install python3-torch python3-numpy, and pip install ./python or run the binary from the repository's bin/)"
		}
		return nil, fmt.Errorf("bench pytorch: %s: %w\n%s", python(), err, msg)
	}
	var res []Result
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		var r Result
		if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
			return res, fmt.Errorf("bench pytorch: a line that is not a result: %q: %w", sc.Text(), err)
		}
		o.Logf("pytorch: %s %s %.4g %s (%s %.4g, ratio %.3f)", r.Case, r.Metric, r.Value, r.Unit, r.Baseline, r.BaselineValue, r.Ratio)
		res = append(res, r)
	}
	if len(res) == 0 {
		return nil, errors.New("bench pytorch: the Python benchmark printed no result")
	}
	ex, err := pytorchExpert(ctx, o)
	if err != nil {
		return res, err
	}
	return append(res, ex...), nil
}

func isDir(p string) bool {
	st, err := os.Stat(p)
	return err == nil && st.IsDir()
}
