package main

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/skyhive/skyhive/checkpoint"
	"github.com/skyhive/skyhive/data"
)

// torchPython is the interpreter of the PyTorch tests: $SKYHIVE_PYTHON,
// else Debian's /usr/bin/python3 (python3-torch), else python3.
func torchPython(t *testing.T) string {
	t.Helper()
	py := os.Getenv("SKYHIVE_PYTHON")
	if py == "" {
		py = "python3"
		if _, err := os.Stat("/usr/bin/python3"); err == nil {
			py = "/usr/bin/python3"
		}
	}
	if err := exec.Command(py, "-c", "import torch").Run(); err != nil {
		t.Skipf("%s cannot import torch (%v): install python3-torch", py, err)
	}
	repo, err := filepath.Abs("../../python")
	if err != nil {
		t.Fatal(err)
	}
	t.Setenv("PYTHONPATH", repo+":"+filepath.Join(repo, "tests"))
	return py
}

// TestPyTorchExperts trains `skyhive train moe` against two servers whose
// experts are PyTorch modules (python/tests/experts.py) computed by their
// executors; a server checkpoints its PyTorch experts and loads them on
// restart; a server whose executor dies stops and says what to do.
func TestPyTorchExperts(t *testing.T) {
	if testing.Short() {
		t.Skip("runs PyTorch executors and trains over libp2p")
	}
	if _, err := os.Stat(filepath.Join(data.DefaultDir, "train-images-idx3-ubyte.gz")); err != nil {
		t.Skip("Fashion-MNIST not installed")
	}
	py := torchPython(t)
	ckpt := filepath.Join(t.TempDir(), "experts.safetensors")
	torchArgs := []string{"--executor", "python", "--python", py, "--device", "cpu", "--module", "experts:make_ffn", "--hidden", "32"}
	first, firstOut := startServerStoppable(t, append([]string{"--experts", "ffn.[0:2].[0:2]", "--checkpoint", ckpt}, torchArgs...)...)
	second, _ := startServerStoppable(t, append([]string{"--experts", "ffn.[2:4].[0:2]", "--dht", first.addr}, torchArgs...)...)
	_ = second

	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	var out syncBuffer
	err := runCLI(ctx, &out, "train", "moe", "--listen", "/ip4/127.0.0.1/tcp/0", "--dht", first.addr, "--grids", "ffn.4.2",
		"--k-best", "2", "--epochs", "1", "--limit", "2048", "--batch", "64", "--eval-limit", "500")
	if err != nil {
		t.Fatalf("train moe: %v\n%s", err, out.String())
	}
	m := regexp.MustCompile(`test accuracy ([0-9.]+)% after \d+ steps \((\d+) failed\)`).FindStringSubmatch(out.String())
	if m == nil {
		t.Fatalf("no accuracy printed:\n%s", out.String())
	}
	acc, _ := strconv.ParseFloat(m[1], 64)
	t.Logf("PyTorch experts on 2 servers: test accuracy %.2f%% after 2,048 examples", acc)
	if acc < 60 || m[2] != "0" {
		t.Fatalf("test accuracy %.2f%% with %s failed steps, want at least 60%% and none failed:\n%s", acc, m[2], out.String())
	}
	if !strings.Contains(firstOut.String(), "PyTorch") {
		t.Fatalf("the server did not say it runs a PyTorch executor:\n%s", firstOut.String())
	}

	// The checkpoint holds the PyTorch experts' weights and AdamW moments
	// under Skyhive's names, and a restarted server loads it.
	if err := first.stop(); err != nil {
		t.Fatalf("server: %v\n%s", err, firstOut.String())
	}
	f, err := checkpoint.Load(ckpt)
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"ffn.0.0/ffn.fc1.weight", "ffn.1.1/opt/ln.weight.exp_avg_sq"} {
		if f.Tensors[name] == nil {
			t.Fatalf("checkpoint lacks %s", name)
		}
	}
	if step, _ := strconv.Atoi(f.Meta["ffn.0.0/step"]); step == 0 {
		t.Fatalf("checkpoint step of ffn.0.0 is %q after training", f.Meta["ffn.0.0/step"])
	}
	again, againOut := startServerStoppable(t, append([]string{"--experts", "ffn.[0:2].[0:2]", "--checkpoint", ckpt}, torchArgs...)...)
	if err := again.stop(); err != nil {
		t.Fatalf("restarted server: %v\n%s", err, againOut.String())
	}
	g, err := checkpoint.Load(ckpt)
	if err != nil {
		t.Fatal(err)
	}
	if g.Meta["ffn.0.0/step"] != f.Meta["ffn.0.0/step"] {
		t.Fatalf("step %s after a restart, %s before: the checkpoint was not loaded", g.Meta["ffn.0.0/step"], f.Meta["ffn.0.0/step"])
	}

	// An executor that dies stops its server with what to do.
	crash, crashOut := startServerStoppable(t, "--experts", "ffn.[0:1].[0:1]", "--executor", "python", "--python", py,
		"--device", "cpu", "--module", "experts:make_faulty", "--hidden", "9")
	out = syncBuffer{}
	_ = runCLI(ctx, &out, "train", "moe", "--listen", "/ip4/127.0.0.1/tcp/0", "--dht", crash.addr, "--grids", "ffn.1.1",
		"--k-best", "1", "--epochs", "1", "--limit", "128", "--batch", "64", "--eval-limit", "64")
	select {
	case <-crash.done:
		err = crash.err
	case <-time.After(30 * time.Second):
		t.Fatalf("the server did not stop after its executor died:\n%s", crashOut.String())
	}
	if err == nil || !strings.Contains(err.Error(), "exit status 3") || !strings.Contains(err.Error(), "start it again") {
		t.Fatalf("server whose executor died: %v", err)
	}

	// A module that does not import fails the start.
	err = runCLI(ctx, &syncBuffer{}, "server", "--listen", "/ip4/127.0.0.1/tcp/0", "--executor", "python", "--python", py,
		"--module", "nosuch.module:make")
	if err == nil || !strings.Contains(err.Error(), "cannot import nosuch.module") {
		t.Fatalf("server with a module that does not import: %v", err)
	}
}

// stoppableServer is a `skyhive server` a test stops itself.
type stoppableServer struct {
	addr   string
	cancel context.CancelFunc
	done   chan struct{} // closed when the server returned err
	err    error
}

// stop stops the server and returns its error.
func (s *stoppableServer) stop() error {
	s.cancel()
	<-s.done
	return s.err
}

// startServerStoppable runs `skyhive server ARGS` on loopback and returns
// it once it serves; it is stopped when the test ends if the
// test has not stopped it.
func startServerStoppable(t *testing.T, args ...string) (*stoppableServer, *syncBuffer) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	s := &stoppableServer{cancel: cancel, done: make(chan struct{})}
	served := &syncBuffer{}
	go func() {
		defer close(s.done)
		s.err = runCLI(ctx, served, append([]string{"server", "--listen", "/ip4/127.0.0.1/tcp/0", "--stats-every", "0"}, args...)...)
	}()
	t.Cleanup(func() {
		cancel()
		select {
		case <-s.done:
		case <-time.After(30 * time.Second):
			t.Errorf("server did not stop")
		}
	})
	for deadline := time.Now().Add(60 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if !strings.Contains(served.String(), "serving ") {
			continue
		}
		for _, line := range strings.Split(served.String(), "\n") {
			if strings.Contains(line, "/p2p/") {
				s.addr = strings.TrimSpace(line)
				return s, served
			}
		}
	}
	cancel()
	t.Fatalf("server printed no address:\n%s", served.String())
	return nil, nil
}
