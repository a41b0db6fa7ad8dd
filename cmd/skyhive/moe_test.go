package main

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/skyhive/skyhive/data"
)

// TestServerAndMoETraining runs `skyhive server` over libp2p on loopback,
// trains against it with `skyhive train --mode moe`, stops the server
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
	ckpt := filepath.Join(t.TempDir(), "experts.safetensors")
	serveCtx, stop := context.WithCancel(ctx)
	var served syncBuffer
	done := make(chan error, 1)
	go func() {
		done <- runCLI(serveCtx, &served, "server", "--experts", "ffn.[0:2].[0:2]", "--hidden", "32",
			"--checkpoint", ckpt, "--stats-every", "200ms", "--declare-every", "2s")
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
	err := runCLI(ctx, &out, "train", "--mode", "moe", "--dht", addr, "--moe-grids", "ffn.2.2", "--moe-hidden", "32",
		"--k-best", "2", "--epochs", "1", "--limit", "1024", "--batch", "64", "--eval-limit", "500", "--trainers", "2")
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
}
