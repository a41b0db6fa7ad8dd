package main

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/skyhive/skyhive/data"
	"github.com/skyhive/skyhive/p2p"
	"github.com/skyhive/skyhive/train"
)

// TestPeerDialFailureSaysElapsed checks that a peer whose DHT address
// refuses connections says how long it tried, not the join timeout.
func TestPeerDialFailureSaysElapsed(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close() // nothing listens there now
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var out syncBuffer
	start := time.Now()
	err = runCLI(ctx, &out, "peer", "--listen", "/ip4/127.0.0.1/tcp/0", "--duration", "5s",
		"--dht", "/ip4/127.0.0.1/tcp/"+strconv.Itoa(port)+"/p2p/12D3KooWHtz3SAKgN44ngiGCvvvWoaPiiymfDZXhSqyjw3q17bWd")
	took := time.Since(start)
	if err == nil {
		t.Fatal("joining a closed port succeeded")
	}
	if took > 25*time.Second {
		t.Skipf("the dial took %v: cannot tell elapsed time from the timeout", took)
	}
	if strings.Contains(err.Error(), "within 30s") || !strings.Contains(err.Error(), "failed after") {
		t.Fatalf("after %v: %v, want the time it took, not the timeout", took, err)
	}
}

// TestMetricsPortInUseNamesMetrics checks that a --metrics port in use is
// reported as the --metrics port, not a --listen one.
func TestMetricsPortInUseNamesMetrics(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	var out syncBuffer
	err = runCLI(context.Background(), &out, "dht", "--listen", "/ip4/127.0.0.1/tcp/0", "--metrics", ln.Addr().String())
	if err == nil {
		t.Fatal("a --metrics port in use was accepted")
	}
	msg := withHint(err).Error()
	if !strings.Contains(msg, "the --metrics port is taken") || strings.Contains(msg, "--listen") {
		t.Fatalf("got %q", msg)
	}
}

// TestUnknownModelSuggestsClosest checks that a misspelt --model is called
// unknown, with the closest name and the list, whatever the data.
func TestUnknownModelSuggestsClosest(t *testing.T) {
	for _, data := range []string{"gcide", "fashion-mnist"} {
		var out syncBuffer
		err := runCLI(context.Background(), &out, "train", "--model", "gpt-mni", "--data", data)
		if err == nil {
			t.Fatalf("--model gpt-mni --data %s accepted", data)
		}
		msg := err.Error()
		if !strings.Contains(msg, "unknown model (did you mean gpt-mini?)") || !strings.Contains(msg, "mlp-small") || strings.Contains(msg, "image classifier") {
			t.Errorf("--data %s: %q", data, msg)
		}
	}
	if err := train.KnownModel("gpt-mini:512x64"); err != nil {
		t.Errorf("a known model with parameters: %v", err)
	}
	if err := train.KnownModel("resnet"); err == nil || strings.Contains(err.Error(), "did you mean") {
		t.Errorf("nothing is close to resnet: %v", err)
	}
}

// TestResumeFinishedCheckpoint checks that resuming a run that has done
// all its epochs says there is nothing left to do and succeeds.
func TestResumeFinishedCheckpoint(t *testing.T) {
	if _, err := os.Stat(filepath.Join(data.DefaultDir, "train-images-idx3-ubyte.gz")); err != nil {
		t.Skip("Fashion-MNIST not installed")
	}
	ckpt := filepath.Join(t.TempDir(), "mlp.safetensors")
	args := []string{"train", "--model", "mlp-small", "--epochs", "1", "--limit", "256", "--batch", "64", "--checkpoint", ckpt, "--resume"}
	var out syncBuffer
	if err := runCLI(context.Background(), &out, args...); err != nil {
		t.Fatalf("first run: %v\n%s", err, out.String())
	}
	out = syncBuffer{}
	if err := runCLI(context.Background(), &out, args...); err != nil {
		t.Fatalf("resuming a finished run: %v\n%s", err, out.String())
	}
	if !strings.Contains(out.String(), "has finished all 1 epochs: nothing left to do") || strings.Contains(out.String(), "after 0 epochs") {
		t.Fatalf("resuming a finished run printed:\n%s", out.String())
	}
}

// TestLoopbackPeerGetsNoReachabilityAdvice checks that a peer listening on
// loopback only (a local pipeline's worker) is not told how to be reached
// from other networks, and that one with a private address still is.
func TestLoopbackPeerGetsNoReachabilityAdvice(t *testing.T) {
	id := "/p2p/12D3KooWHtz3SAKgN44ngiGCvvvWoaPiiymfDZXhSqyjw3q17bWd"
	var out strings.Builder
	p2p.WriteReach(&out, p2p.Reach{Status: "local", Addrs: []string{"/ip4/127.0.0.1/tcp/4001" + id, "/ip6/::1/tcp/4001" + id}, Advice: "forward a port"})
	if strings.Contains(out.String(), "forward a port") || !strings.Contains(out.String(), "this machine only") || !strings.Contains(out.String(), "127.0.0.1") {
		t.Fatalf("loopback peer:\n%s", out.String())
	}
	out.Reset()
	p2p.WriteReach(&out, p2p.Reach{Status: "local", Addrs: []string{"/ip4/192.168.1.5/tcp/4001" + id}, Advice: "forward a port"})
	if !strings.Contains(out.String(), "forward a port") {
		t.Fatalf("peer on a private network got no advice:\n%s", out.String())
	}
}
