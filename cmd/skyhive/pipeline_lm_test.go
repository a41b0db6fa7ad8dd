package main

import (
	"context"
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/skyhive/skyhive/pipeline"
)

// train pipeline --model gpt-mini --data text:PATH trains a language model
// split over two local worker processes (--strategy even) and reports the validation loss and
// perplexity of the gathered model.
func TestTrainPipelineLM(t *testing.T) {
	if testing.Short() {
		t.Skip("starts worker processes")
	}
	trainPipelineLM(t)
}

// --executor python: the same run with the workers' layers in PyTorch.
func TestTrainPipelineLMInPyTorch(t *testing.T) {
	if testing.Short() {
		t.Skip("starts worker processes and PyTorch executors")
	}
	py := torchPython(t)
	log := trainPipelineLM(t, "--executor", "python", "--python", py, "--device", "cpu")
	if n := strings.Count(log, "pipeline worker computing in PyTorch"); n != 2 {
		t.Fatalf("%d workers say they compute in PyTorch, want 2:\n%s", n, tail(log))
	}
}

// trainPipelineLM runs train pipeline on a GPT over 2 local workers with
// the extra flags, checks its result and returns its log.
func trainPipelineLM(t *testing.T, extra ...string) string {
	t.Helper()
	corpus := writeText(t)
	var stdout syncBuffer
	args := []string{"train", "pipeline", "--workers", "2", "--model", "gpt-mini", "--data", "text:" + corpus,
		"--vocab", "280", "--seq", "16", "--batch", "4", "--micro", "2", "--schedule", "gpipe", "--strategy", "even", "--steps", "6", "--log-every", "0", "--json"}
	p := startCLI(t, &stdout, append(args, extra...)...)
	if err := p.wait(t, 3*time.Minute); err != nil {
		t.Fatalf("%v\n%s", err, tail(p.stderr.String()))
	}
	var res pipeline.LMRunResult
	if err := json.Unmarshal([]byte(stdout.String()), &res); err != nil {
		t.Fatalf("stdout is not the JSON result: %v\n%s\n%s", err, stdout.String(), tail(p.stderr.String()))
	}
	if res.Model != "gpt-mini:280x16" || res.Iterations != 6 || res.Ran != 6 || len(res.Plan.Stages) != 2 || res.ValTokens < 17 {
		t.Fatalf("result %+v", res)
	}
	if !(res.ValLoss > 0) || math.Abs(res.ValPerplexity-math.Exp(res.ValLoss)) > 1e-9*res.ValPerplexity || !(res.ValPerplexity < 280) {
		t.Fatalf("validation loss %v, perplexity %v: want a model better than uniform over 280 tokens", res.ValLoss, res.ValPerplexity)
	}
	if !(res.FinalAccuracy >= 0 && res.FinalAccuracy <= 1) {
		t.Fatalf("token accuracy %v", res.FinalAccuracy)
	}
	if !strings.Contains(p.stderr.String(), "untied") {
		t.Errorf("the log does not say the head is untied:\n%s", tail(p.stderr.String()))
	}
	return p.stderr.String()
}

// Flags of the wrong kind of model are refused before any worker starts.
func TestTrainPipelineLMBadFlags(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--model", "gpt-mini", "--data", "fashion-mnist", "--steps", "5"}, "train it on text"},
		{[]string{"--model", "gpt-mini", "--data", "text:x.txt"}, "--steps"},
		{[]string{"--model", "gpt-mini", "--data", "text:x.txt", "--steps", "5", "--epochs", "2"}, "--epochs is for image models"},
		{[]string{"--model", "mlp", "--vocab", "300"}, "--vocab is for language models"},
	} {
		var out syncBuffer
		err := runCLI(context.Background(), &out, append([]string{"train", "pipeline", "--workers", "2"}, tc.args...)...)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: %v, want an error about %q", tc.args, err, tc.want)
		}
	}
}

// A worker whose PyTorch executor dies stops and says what to do; the
// executor of a worker that stops goes with it.
func TestPyTorchWorkerExecutorDies(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a coordinator, a worker and a PyTorch executor")
	}
	py := torchPython(t)
	corpus := writeText(t)
	var coordErr syncBuffer
	startCLIWith(t, nil, &coordErr, "train", "pipeline", "--join-wait", "1", "--listen", "/ip4/127.0.0.1/tcp/0", "--model", "gpt-mini",
		"--data", "text:"+corpus, "--vocab", "280", "--seq", "16", "--batch", "4", "--steps", "100000", "--log-every", "0")
	join := regexp.MustCompile(`skyhive worker --join (\S+)`)
	waitFor(t, "the coordinator's address", time.Minute, func() bool { return join.MatchString(coordErr.String()) })
	addr := join.FindStringSubmatch(coordErr.String())[1]

	var workerErr syncBuffer
	w := startCLIWith(t, nil, &workerErr, "worker", "--join", addr, "--executor", "python", "--python", py, "--device", "cpu")
	waitFor(t, "the worker's executor", time.Minute, func() bool { return strings.Contains(workerErr.String(), "computing in PyTorch") })
	waitFor(t, "training", time.Minute, func() bool { return strings.Contains(coordErr.String(), "plan (") })
	exec := childrenRunning(t, w.cmd.Process.Pid, "skyhive.executor")
	if len(exec) != 1 {
		t.Fatalf("the worker has %d executor children, want 1", len(exec))
	}
	if err := syscall.Kill(exec[0], syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	err := w.wait(t, 30*time.Second)
	if err == nil || !strings.Contains(workerErr.String(), "the PyTorch executor exited") || !strings.Contains(workerErr.String(), "start the worker again") {
		t.Fatalf("worker after its executor was killed: %v\n%s", err, tail(workerErr.String()))
	}
}

// childrenRunning returns the PIDs of pid's children whose command line
// contains what.
func childrenRunning(t *testing.T, pid int, what string) []int {
	t.Helper()
	entries, err := os.ReadDir("/proc")
	if err != nil {
		t.Skipf("no /proc: %v", err)
	}
	var out []int
	for _, e := range entries {
		child, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		stat, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue
		}
		// pid (comm) state ppid ...: comm may hold spaces, so parse after ')'.
		fields := strings.Fields(string(stat[strings.LastIndexByte(string(stat), ')')+1:]))
		if len(fields) < 2 || fields[1] != strconv.Itoa(pid) {
			continue
		}
		cmdline, _ := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if strings.Contains(string(cmdline), what) {
			out = append(out, child)
		}
	}
	return out
}
