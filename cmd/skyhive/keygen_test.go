package main

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// A swarm closed with a secret or a swarm key: members store and read
// records; strangers and peers with a wrong secret or no token cannot.
func TestKeygenAndClosedSwarm(t *testing.T) {
	dir := t.TempDir()
	f := func(name string) string { return filepath.Join(dir, name) }
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var out syncBuffer
	run := func(args ...string) error {
		out = syncBuffer{}
		return runCLI(ctx, &out, args...)
	}
	must := func(args ...string) string {
		t.Helper()
		if err := run(args...); err != nil {
			t.Fatalf("%v: %v\n%s", args, err, out.String())
		}
		return out.String()
	}

	// Secret.
	must("keygen", "secret", f("s1"))
	if st, err := os.Stat(f("s1")); err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("secret file: %v, %v", st, err)
	}
	if err := run("keygen", "secret", f("s1")); err == nil || !strings.Contains(err.Error(), "exists") {
		t.Fatalf("overwrote a secret: %v", err)
	}
	must("keygen", "secret", f("s2"))
	addr := startDHTNode(t, "--swarm-secret", f("s1"))
	put := func(extra ...string) error {
		return run(append([]string{"dht", "put", "--listen", "/ip4/127.0.0.1/tcp/0", "--dht", addr}, append(extra, "k", "v")...)...)
	}
	if err := put("--swarm-secret", f("s1")); err != nil || !strings.Contains(out.String(), "stored on 1 peers") {
		t.Fatalf("member put: %v\n%s", err, out.String())
	}
	if err := put(); err == nil {
		t.Fatalf("a stranger's put succeeded:\n%s", out.String())
	}
	if err := put("--swarm-secret", f("s2")); err == nil || !strings.Contains(err.Error(), "wrong swarm secret") {
		t.Fatalf("wrong secret: %v\n%s", err, out.String())
	}

	// Swarm key and member tokens.
	must("keygen", "swarm", f("swarm.key"))
	idA := strings.TrimSpace(must("keygen", "identity", f("a.key")))
	idB := strings.TrimSpace(must("keygen", "identity", f("b.key")))
	must("keygen", "token", "--swarm-private-key", f("swarm.key"), "--peer", idA, f("a.token"))
	must("keygen", "token", "--swarm-private-key", f("swarm.key"), "--peer", idB, f("b.token"))
	addr = startDHTNode(t, "--swarm-key", f("swarm.key.pub"), "--member-token", f("a.token"), "--identity", f("a.key"))
	if err := put("--swarm-key", f("swarm.key.pub"), "--member-token", f("b.token"), "--identity", f("b.key")); err != nil {
		t.Fatalf("member put: %v\n%s", err, out.String())
	}
	// b's token with another identity: refused at start.
	if err := put("--swarm-key", f("swarm.key.pub"), "--member-token", f("b.token")); err == nil || !strings.Contains(err.Error(), "member token") {
		t.Fatalf("another peer's token: %v", err)
	}
	if err := put("--swarm-key", f("swarm.key.pub")); err == nil || !strings.Contains(err.Error(), "--member-token") {
		t.Fatalf("no token: %v", err)
	}
	if err := put("--swarm-secret", f("s1"), "--swarm-key", f("swarm.key.pub")); err == nil || !strings.Contains(err.Error(), "choose one") {
		t.Fatalf("both: %v", err)
	}
}
