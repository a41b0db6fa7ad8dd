package main

import (
	"errors"
	"os/exec"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/skyhive/skyhive/launch"
)

// signalled starts `skyhive args...`, waits until its output contains
// ready and then for settle, sends SIGTERM and checks that it exits within stopBound with
// status 0 (a command that finished its work: a peer leaves cleanly) or
// launch.ForcedExit (one that stopped before finishing, saying so), and without a
// raw "context canceled" in its output. It returns the output.
func signalled(t *testing.T, ready string, settle time.Duration, args ...string) string {
	t.Helper()
	took, out, err := startAndStopAfter(t, ready, settle, args...)
	var exit *exec.ExitError
	switch {
	case err == nil:
	case errors.As(err, &exit) && exit.ExitCode() == launch.ForcedExit:
		if !strings.Contains(out, "stopped before finishing") {
			t.Errorf("%v: exit status %d without saying it stopped before finishing:\n%s", args, launch.ForcedExit, tail(out))
		}
	default:
		t.Fatalf("%v exited with %v after SIGTERM:\n%s", args, err, tail(out))
	}
	if took > stopBound {
		t.Errorf("%v took %v to stop after SIGTERM, want at most %v:\n%s", args, took.Round(time.Millisecond), stopBound, tail(out))
	}
	if strings.Contains(out, "context canceled") {
		t.Errorf("%v printed a raw context error after SIGTERM:\n%s", args, tail(out))
	}
	t.Logf("stopped %v after SIGTERM; output ends:\n%s", took.Round(time.Millisecond), tail(out))
	return out
}

// TestSignalStopsLongRunningCommands sends SIGTERM to every long-running
// command that needs no other process, in the middle of its work, and
// checks that each stops within stopBound. The server, dht and train are
// in signal_test.go; the commands that join another process are below.
func TestSignalStopsLongRunningCommands(t *testing.T) {
	if !fashionMNISTInstalled() {
		t.Skip("Fashion-MNIST not installed")
	}
	cases := []struct {
		name, ready string
		settle      time.Duration
		args        []string
	}{
		{"train pipeline", "iter 9 ", 0, []string{"train", "pipeline", "--workers", "2", "--steps", "100000"}},
		{"demo", "STRATEGY", 0, []string{"demo"}},
		{"train averaging", "5s: ", 0, []string{"train", "averaging", "--peers", "2", "--duration", "5m"}},
		{"demo moe", "training a DMoE classifier", 2 * time.Second, []string{"demo", "moe"}},
		{"bench", "gemm 256:", 0, []string{"bench", "gemm"}},
		{"bench layers", "BERT-large layer", 2 * time.Second, []string{"bench", "layers"}}, // seconds per measurement
		{"bench soak", "5s: peer0", 0, []string{"bench", "soak", "--duration", "5m"}},
		{"experiment", "reachable at", 5 * time.Second, []string{"experiment", "sky-computing", "--quick", "--out", t.TempDir()}},
	}
	for _, c := range cases {
		t.Run(strings.ReplaceAll(c.name, " ", "-"), func(t *testing.T) {
			signalled(t, c.ready, c.settle, c.args...)
		})
	}
}

// joinAddr matches the address a DHT node or a coordinator prints for others
// to join.
var joinAddr = regexp.MustCompile(`/ip4/127\.0\.0\.1/tcp/[0-9]+/p2p/[A-Za-z0-9]+`)

// startService starts `skyhive args...`, waits until it prints a loopback
// address to join and returns that address; the process is killed when
// the test ends.
func startService(t *testing.T, args ...string) string {
	t.Helper()
	seen := make(chan struct{})
	w := &watchWriter{want: "/p2p/", seen: seen}
	p := startCLIWith(t, w, w, args...)
	deadline := time.After(30 * time.Second)
	for {
		select {
		case <-seen:
		case <-p.done:
			t.Fatalf("%v exited: %v\n%s", args, p.err, tail(p.stderr.String()))
		case <-deadline:
			t.Fatalf("%v printed no address in 30s:\n%s", args, tail(p.stderr.String()))
		}
		if addr := joinAddr.FindString(w.String()); addr != "" {
			return addr
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestSignalStopsJoiningCommands sends SIGTERM, in the middle of their
// work, to the commands that join other processes: an averaging peer, an
// MoE trainer, and a pipeline worker serving a coordinator.
func TestSignalStopsJoiningCommands(t *testing.T) {
	if !fashionMNISTInstalled() {
		t.Skip("Fashion-MNIST not installed")
	}
	dht := startService(t, "dht", "--listen", "/ip4/127.0.0.1/tcp/0")
	t.Run("peer", func(t *testing.T) {
		out := signalled(t, "peer [", 0, "peer", "--dht", dht, "--listen", "/ip4/127.0.0.1/tcp/0",
			"--min-peers", "1", "--duration", "5m", "--run-id", "signal")
		if !strings.Contains(out, "test accuracy") {
			t.Errorf("the peer left without its final evaluation:\n%s", tail(out))
		}
	})
	t.Run("train-moe", func(t *testing.T) {
		startService(t, "server", "--dht", dht, "--listen", "/ip4/127.0.0.1/tcp/0", "--experts", "ffn.[0:4].[0:4]")
		signalled(t, "epoch 1/", 0, "train", "moe", "--dht", dht, "--grids", "ffn.4.4", "--listen", "/ip4/127.0.0.1/tcp/0")
	})
	t.Run("worker", func(t *testing.T) {
		coord := startService(t, "train", "pipeline", "--listen", "/ip4/127.0.0.1/tcp/0", "--join-wait", "1", "--steps", "100000")
		signalled(t, "reachability", 3*time.Second, "worker", "--join", coord, "--listen", "/ip4/127.0.0.1/tcp/0")
	})
}
