package main

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/skyhive/skyhive/data"
	"github.com/skyhive/skyhive/launch"
	"github.com/skyhive/skyhive/moe/server"
)

// TestServerAndMoETraining runs `skyhive server` over libp2p on loopback,
// trains against it with `skyhive train moe`, stops the server
// (which checkpoints) and checks the checkpoint exists.
func TestServerAndMoETraining(t *testing.T) {
	if testing.Short() {
		t.Skip("trains over libp2p for a few seconds")
	}
	if _, err := os.Stat(filepath.Join(data.DefaultDir, "train-images-idx3-ubyte.gz")); err != nil {
		t.Skip("Fashion-MNIST not installed")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	dir := t.TempDir()
	ckpt := filepath.Join(dir, "experts.safetensors")
	serverStats, trainStats := filepath.Join(dir, "server.jsonl"), filepath.Join(dir, "train.jsonl")
	serveCtx, stop := context.WithCancel(ctx)
	var served syncBuffer
	done := make(chan error, 1)
	go func() {
		done <- runCLI(serveCtx, &served, "server", "--listen", "/ip4/127.0.0.1/tcp/0", "--experts", "ffn.[0:2].[0:2]", "--hidden", "32",
			"--checkpoint", ckpt, "--stats-every", "200ms", "--declare-every", "2s", "--stats", serverStats)
	}()
	var addr string
	for deadline := time.Now().Add(10 * time.Second); addr == "" && time.Now().Before(deadline); {
		for _, line := range strings.Split(served.String(), "\n") {
			if strings.Contains(line, "/p2p/") && addr == "" {
				addr = strings.TrimSpace(line)
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	if addr == "" {
		stop()
		<-done
		t.Fatalf("server printed no address:\n%s", served.String())
	}
	var out syncBuffer
	err := runCLI(ctx, &out, "train", "moe", "--listen", "/ip4/127.0.0.1/tcp/0", "--dht", addr, "--grids", "ffn.2.2", "--hidden", "32",
		"--k-best", "2", "--epochs", "1", "--limit", "1024", "--batch", "64", "--eval-limit", "500", "--trainers", "2",
		"--stats", trainStats, "--latency", "1ms")
	stop()
	serr := <-done
	if err != nil {
		t.Fatalf("train: %v\n%s", err, out.String())
	}
	if serr != nil {
		t.Fatalf("server: %v", serr)
	}
	if !strings.Contains(out.String(), "test accuracy") {
		t.Fatalf("no accuracy printed:\n%s", out.String())
	}
	if !strings.Contains(served.String(), "ffn.0.0") || !strings.Contains(served.String(), "BWD REQ") {
		t.Fatalf("server printed no per-expert statistics:\n%s", served.String())
	}
	if _, err := os.Stat(ckpt); err != nil {
		t.Fatalf("no checkpoint after shutdown: %v", err)
	}
	// --stats: one line per epoch from the trainer, one per interval
	// and one on exit from the server.
	for path, minLines := range map[string]int{trainStats: 1, serverStats: 2} {
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		lines := strings.Split(strings.TrimSpace(string(b)), "\n")
		if len(lines) < minLines {
			t.Fatalf("%s: %d lines, want at least %d", path, len(lines), minLines)
		}
		for _, l := range lines {
			var v map[string]any
			if err := json.Unmarshal([]byte(l), &v); err != nil {
				t.Fatalf("%s: %v in %q", path, err, l)
			}
		}
	}
}

// startServer runs `skyhive server ARGS` on loopback until the test ends
// and returns the address it prints and its output.
func startServer(t *testing.T, args ...string) (string, *syncBuffer) {
	t.Helper()
	ctx, stop := context.WithCancel(context.Background())
	served := &syncBuffer{}
	done := make(chan error, 1)
	go func() {
		done <- runCLI(ctx, served, append([]string{"server", "--listen", "/ip4/127.0.0.1/tcp/0", "--stats-every", "0"}, args...)...)
	}()
	t.Cleanup(func() {
		stop()
		if err := <-done; err != nil {
			t.Errorf("server: %v", err)
		}
	})
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		for _, line := range strings.Split(served.String(), "\n") {
			if strings.Contains(line, "/p2p/") {
				return strings.TrimSpace(line), served
			}
		}
	}
	t.Fatalf("server printed no address:\n%s", served.String())
	return "", nil
}

// TestMoEHiddenFromDHT checks that `train moe` takes the experts' hidden
// size from their DHT records when --hidden is not given, and that a
// --hidden that differs from the experts' is one error naming the flag,
// before any step is taken.
func TestMoEHiddenFromDHT(t *testing.T) {
	if testing.Short() {
		t.Skip("trains over libp2p")
	}
	if _, err := os.Stat(filepath.Join(data.DefaultDir, "train-images-idx3-ubyte.gz")); err != nil {
		t.Skip("Fashion-MNIST not installed")
	}
	addr, _ := startServer(t, "--experts", "ffn.[0:2].[0:2]", "--hidden", "32")
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	common := []string{"train", "moe", "--listen", "/ip4/127.0.0.1/tcp/0", "--dht", addr, "--grids", "ffn.2.2", "--k-best", "2",
		"--epochs", "1", "--limit", "256", "--batch", "64", "--eval-limit", "100"}
	var out syncBuffer
	err := runCLI(ctx, &out, append(common, "--hidden", "16")...)
	if err == nil || !strings.Contains(err.Error(), "--hidden 16") || !strings.Contains(err.Error(), "pass --hidden 32") {
		t.Fatalf("--hidden 16 against experts of hidden 32: %v, want one error naming --hidden 32\n%s", err, out.String())
	}
	if strings.Contains(out.String(), "steps failed") {
		t.Fatalf("steps were taken before the mismatch was reported:\n%s", out.String())
	}
	out = syncBuffer{}
	if err := runCLI(ctx, &out, common...); err != nil {
		t.Fatalf("train moe without --hidden: %v\n%s", err, out.String())
	}
	if !strings.Contains(out.String(), "hidden size 32") || !strings.Contains(out.String(), "(0 failed)") {
		t.Fatalf("the model did not take the experts' hidden size, or steps failed:\n%s", out.String())
	}
}

// The options of `skyhive server` default to the library's
// (server.Defaults), so that a config file and the flags agree.
func TestServerFlagsDefaultToLibrary(t *testing.T) {
	got, want := serverDefaults(), server.Defaults()
	got.Net, got.Process, got.Output = launch.Net{}, launch.Process{}, launch.Output{}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("flags give %+v, server.Defaults %+v", got, want)
	}
}
