package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/skyhive/skyhive/launch"
	"github.com/skyhive/skyhive/p2p"
	"github.com/skyhive/skyhive/p2p/dialback"
)

// syncBuffer is a bytes.Buffer safe for one writer and one reader.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func runCLI(ctx context.Context, out *syncBuffer, args ...string) error {
	root := newRootCmd()
	root.SetArgs(args)
	root.SetOut(out)
	root.SetErr(out)
	return root.ExecuteContext(ctx)
}

// startDHTNode runs `skyhive dht ARGS --json` until the test ends and
// returns the address it prints.
func startDHTNode(t *testing.T, args ...string) string {
	t.Helper()
	ctx, stop := context.WithCancel(context.Background())
	var served syncBuffer
	done := make(chan error, 1)
	go func() {
		done <- runCLI(ctx, &served, append([]string{"dht", "--listen", "/ip4/127.0.0.1/tcp/0", "--json"}, args...)...)
	}()
	t.Cleanup(func() {
		stop()
		if err := <-done; err != nil {
			t.Errorf("dht node: %v", err)
		}
	})
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		for _, line := range strings.Split(served.String(), "\n") {
			var info struct{ Addrs []string }
			if json.Unmarshal([]byte(line), &info) == nil && len(info.Addrs) > 0 {
				return info.Addrs[0]
			}
		}
	}
	t.Fatalf("the DHT node printed no address: %q", served.String())
	return ""
}

func TestDHTCommands(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	stats := filepath.Join(t.TempDir(), "dht.jsonl")
	// No status record of its own: the one record is the put.
	addr := startDHTNode(t, "--stats", stats, "--stats-every", "20ms", "--status-every", "0")
	var out syncBuffer
	if err := runCLI(ctx, &out, "dht", "put", "--listen", "/ip4/127.0.0.1/tcp/0", "--dht", addr, "--subkey", "s1", "cli-key", "v1"); err != nil {
		t.Fatalf("put: %v (%s)", err, out.String())
	}
	if !strings.Contains(out.String(), "stored on 1 peers") {
		t.Fatalf("put printed %q", out.String())
	}
	out = syncBuffer{}
	if err := runCLI(ctx, &out, "dht", "get", "--listen", "/ip4/127.0.0.1/tcp/0", "--bootstrap", addr, "cli-key"); err != nil {
		t.Fatalf("get: %v", err)
	}
	if !strings.HasPrefix(out.String(), "s1\tv1\texpires in ") {
		t.Fatalf("get printed %q", out.String())
	}
	// --stats: a line after the put counts its record.
	stored := false
	for deadline := time.Now().Add(10 * time.Second); !stored && time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		b, _ := os.ReadFile(stats)
		for _, l := range strings.Split(strings.TrimSpace(string(b)), "\n") {
			var st struct{ Peers, Records int }
			if json.Unmarshal([]byte(l), &st) == nil && st.Records == 1 {
				stored = true
			}
		}
	}
	if !stored {
		t.Error("no --stats line counts the stored record")
	}
	if err := runCLI(ctx, &out, "dht", "get", "--listen", "/ip4/127.0.0.1/tcp/0", "--bootstrap", addr, "missing"); err == nil {
		t.Fatal("get of a missing key succeeded")
	}
	// doctor: the DHT node dials this host back over loopback.
	var doc syncBuffer
	if err := runCLI(ctx, &doc, "doctor", "--listen", "/ip4/127.0.0.1/tcp/0", "--dht", addr, "--json"); err != nil {
		t.Fatalf("doctor: %v\n%s", err, doc.String())
	}
	var rep dialback.Report
	if err := json.Unmarshal([]byte(doc.String()), &rep); err != nil || !rep.Reachable || len(rep.Seen) != 1 {
		t.Fatalf("doctor reported %+v (%v):\n%s", rep, err, doc.String())
	}
	// A relay that refuses (the DHT node runs no relay service) is an error
	// that says what --relay needs.
	err := runCLI(ctx, &doc, "doctor", "--listen", "/ip4/127.0.0.1/tcp/0", "--dht", addr, "--relay", addr)
	if !errors.Is(err, p2p.ErrRelay) || !strings.Contains(withHint(err).Error(), "--relay-service") {
		t.Fatalf("doctor with a refusing relay: %v", err)
	}
	if err := runCLI(ctx, &out, "dht", "put", "--bootstrap", "/ip4/127.0.0.1/tcp/1", "k", "v"); err == nil {
		t.Fatal("bootstrap address without /p2p accepted")
	}
	// A record beyond the DHT's maximum lifetime is refused up front.
	if err := runCLI(ctx, &out, "dht", "put", "--dht", addr, "--ttl", "700h", "ffn.", "x"); err == nil || !strings.Contains(err.Error(), "at most 6h") {
		t.Fatalf("put --ttl 700h: %v", err)
	}
}

// A DHT node runs from its config file as `skyhive dht` does with the same
// options: it prints its peer ID as JSON, appends statistics to its stats
// file and stops when asked; a bad option is refused with its flag's name.
func TestDHTRoleFromFile(t *testing.T) {
	dir := t.TempDir()
	path, stats := filepath.Join(dir, "dht.json"), filepath.Join(dir, "stats.jsonl")
	if err := launch.Write(path, launch.DHT{Net: launch.Net{Listen: []string{"/ip4/127.0.0.1/tcp/0"}},
		Process: launch.Process{StatusEvery: -1}, Output: launch.Output{JSON: true, Stats: stats},
		StatsEvery: launch.Duration(50 * time.Millisecond)}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var stdout, stderr syncBuffer
	done := make(chan error, 1)
	go func() { done <- runRoleFile(ctx, path, &stdout, &stderr) }()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if b, _ := os.ReadFile(stats); bytes.Contains(b, []byte(`"records"`)) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no statistics:\n%s\n%s", stdout.String(), stderr.String())
		}
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("dht: %v\n%s", err, stderr.String())
	}
	var id struct{ Peer string }
	if err := json.Unmarshal([]byte(stdout.String()), &id); err != nil || id.Peer == "" {
		t.Errorf("stdout %q: %v", stdout.String(), err)
	}
	if !strings.Contains(stderr.String(), "stopping") {
		t.Errorf("stderr lacks stopping:\n%s", stderr.String())
	}
	if err := launch.Write(path, launch.DHT{Output: launch.Output{Stats: stats}, StatsEvery: -1}); err != nil {
		t.Fatal(err)
	}
	if err := runRoleFile(context.Background(), path, &stdout, &stderr); err == nil || !strings.Contains(err.Error(), "--stats-every") {
		t.Errorf("negative stats_every: got %v", err)
	}
}
