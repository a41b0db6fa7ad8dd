package main

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/skyhive/skyhive/data"
	"github.com/skyhive/skyhive/launch"
)

// stopBound is how soon after the first SIGINT or SIGTERM a long-running
// command must have exited.
const stopBound = 2 * time.Second

// startAndStop starts the binary as `skyhive args...`, waits until its
// output contains ready, sends SIGTERM and returns how long it took to
// exit, its output (stdout and stderr together) and its error.
func startAndStop(t *testing.T, ready string, args ...string) (time.Duration, string, error) {
	t.Helper()
	return startAndStopAfter(t, ready, 0, args...)
}

// startAndStopAfter is startAndStop that lets the command work for settle
// after it printed ready.
func startAndStopAfter(t *testing.T, ready string, settle time.Duration, args ...string) (time.Duration, string, error) {
	t.Helper()
	seen := make(chan struct{})
	w := &watchWriter{want: ready, seen: seen}
	p := startCLIWith(t, w, w, args...)
	select {
	case <-seen:
	case <-p.done:
		t.Fatalf("%v exited before %q: %v\n%s", args, ready, p.err, tail(p.stderr.String()))
	case <-time.After(30 * time.Second):
		t.Fatalf("%v printed no %q in 30s:\n%s", args, ready, tail(p.stderr.String()))
	}
	select {
	case <-time.After(settle):
	case <-p.done:
		t.Fatalf("%v exited %v after %q: %v\n%s", args, settle, ready, p.err, tail(w.String()))
	}
	sent := time.Now()
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case <-p.done:
		took := time.Since(sent)
		return took, w.String(), p.err
	case <-time.After(stopBound + 10*time.Second):
		t.Fatalf("%v still running %v after SIGTERM:\n%s", args, stopBound+10*time.Second, tail(p.stderr.String()))
		return 0, "", nil
	}
}

// watchWriter closes seen once what was written contains want.
type watchWriter struct {
	mu   sync.Mutex
	buf  strings.Builder
	want string
	seen chan struct{}
	done bool
}

// String returns what was written so far.
func (w *watchWriter) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.buf.String()
}

func (w *watchWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.buf.Write(p)
	if !w.done && strings.Contains(w.buf.String(), w.want) {
		w.done = true
		close(w.seen)
	}
	return len(p), nil
}

// TestSignalStopsServer starts `skyhive server` with the README's 16×16
// grid and its defaults, which must be serving within seconds, and checks
// that SIGTERM stops it within stopBound; then the same with the default
// grid and a checkpoint, which it must have written when it exits.
func TestSignalStopsServer(t *testing.T) {
	start := time.Now()
	took, out, err := startAndStop(t, "Ctrl-C to stop", "server", "--listen", "/ip4/127.0.0.1/tcp/0",
		"--experts", "ffn.[0:16].[0:16]")
	if err != nil {
		t.Fatalf("server exited with %v after SIGTERM:\n%s", err, tail(out))
	}
	if took > stopBound {
		t.Fatalf("server took %v to stop after SIGTERM, want at most %v:\n%s", took, stopBound, tail(out))
	}
	t.Logf("16×16 grid: up and stopped in %v; stopped %v after SIGTERM", time.Since(start).Round(time.Millisecond), took.Round(time.Millisecond))

	ckpt := t.TempDir() + "/experts.safetensors"
	took, out, err = startAndStop(t, "Ctrl-C to stop", "server", "--listen", "/ip4/127.0.0.1/tcp/0", "--checkpoint", ckpt)
	if err != nil {
		t.Fatalf("server exited with %v after SIGTERM:\n%s", err, tail(out))
	}
	if took > stopBound {
		t.Fatalf("server with --checkpoint took %v to stop after SIGTERM, want at most %v:\n%s", took, stopBound, tail(out))
	}
	if _, err := os.Stat(ckpt); err != nil {
		t.Fatalf("no checkpoint after SIGTERM: %v", err)
	}
}

// TestSignalStopsServerSetup sends SIGTERM while a server creates large
// experts (256 of hidden 512, 8.6 GB if it went on): it must stop creating
// them and exit within stopBound.
func TestSignalStopsServerSetup(t *testing.T) {
	took, stderr, err := startAndStop(t, "expert server hosting", "server", "--listen", "/ip4/127.0.0.1/tcp/0",
		"--experts", "ffn.[0:16].[0:16]", "--hidden", "512", "--lazy=false")
	var exit *exec.ExitError
	if err != nil && !errors.As(err, &exit) {
		t.Fatal(err)
	}
	if took > stopBound {
		t.Fatalf("server took %v to stop during setup, want at most %v:\n%s", took, stopBound, tail(stderr))
	}
}

// TestSignalStopsDHT checks that SIGTERM stops `skyhive dht` within
// stopBound.
func TestSignalStopsDHT(t *testing.T) {
	took, stderr, err := startAndStop(t, "/p2p/", "dht", "--listen", "/ip4/127.0.0.1/tcp/0")
	if err != nil {
		t.Fatalf("dht exited with %v after SIGTERM:\n%s", err, tail(stderr))
	}
	if took > stopBound {
		t.Fatalf("dht took %v to stop after SIGTERM, want at most %v", took, stopBound)
	}
}

// TestSignalStopsTrain checks that SIGTERM stops `skyhive train` within
// stopBound, saying it stopped before finishing (no "context canceled"),
// with the exit status of an interrupted command.
func TestSignalStopsTrain(t *testing.T) {
	if _, err := os.Stat(filepath.Join(data.DefaultDir, "train-images-idx3-ubyte.gz")); err != nil {
		t.Skip("Fashion-MNIST not installed")
	}
	took, out, err := startAndStop(t, "epoch 1/1", "train", "--model", "mlp-small", "--epochs", "1", "--batch", "8")
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() != launch.ForcedExit {
		t.Fatalf("train exited with %v after SIGTERM, want status %d:\n%s", err, launch.ForcedExit, tail(out))
	}
	if took > stopBound {
		t.Fatalf("train took %v to stop after SIGTERM, want at most %v", took, stopBound)
	}
	if !strings.Contains(out, "stopped before finishing: interrupted") || strings.Contains(out, "context canceled") {
		t.Fatalf("output after SIGTERM:\n%s", tail(out))
	}
}
