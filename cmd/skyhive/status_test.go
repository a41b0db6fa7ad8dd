package main

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/skyhive/skyhive/metrics"
	"github.com/skyhive/skyhive/p2p"
)

// TestStatusCommand runs a DHT node and an expert server in this process,
// both publishing status records, and reads them with skyhive status.
func TestStatusCommand(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 45*time.Second)
	defer cancel()
	addr := startDHTNode(t, "--region", "eu-west", "--status-every", "1s")

	sctx, stopServer := context.WithCancel(ctx)
	var served syncBuffer
	done := make(chan error, 1)
	go func() {
		done <- runCLI(sctx, &served, "server", "--listen", "/ip4/127.0.0.1/tcp/0", "--dht", addr, "--experts", "ffn.[0:2].[0:2]",
			"--hidden", "8", "--lazy", "--stats-every", "0", "--region", "us-east", "--status-every", "1s")
	}()
	defer func() {
		stopServer()
		if err := <-done; err != nil {
			t.Errorf("server: %v\n%s", err, served.String())
		}
	}()

	var rep metrics.StatusReport
	for deadline := time.Now().Add(30 * time.Second); ; {
		var out syncBuffer
		if err := runCLI(ctx, &out, "status", "--listen", "/ip4/127.0.0.1/tcp/0", "--dht", addr, "--json", "--timeout", "10s"); err != nil {
			t.Fatalf("status: %v\n%s", err, out.String())
		}
		rep = metrics.StatusReport{}
		if err := json.Unmarshal([]byte(out.String()), &rep); err != nil {
			t.Fatalf("status --json printed %q: %v", out.String(), err)
		}
		if len(rep.Peers) == 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("status shows %d peers, want the DHT node and the server:\n%s\nserver:\n%s", len(rep.Peers), out.String(), served.String())
		}
		time.Sleep(200 * time.Millisecond)
	}
	byRole := map[string]metrics.Status{}
	for _, s := range rep.Peers {
		byRole[s.Role] = s
	}
	d, s := byRole[metrics.RoleDHT], byRole[metrics.RoleServer]
	if d.Region != "eu-west" || d.DHT == nil || d.Version == "" || len(d.Addrs) == 0 || d.Reach == "" {
		t.Errorf("DHT node's record: %+v", d)
	}
	if s.Region != "us-east" || s.Experts == nil || s.Experts.Hosted != 4 || len(s.Experts.Loads) != 4 || !s.Alive(time.Now()) {
		t.Errorf("server's record: %+v", s)
	}
	if rep.Dropped != 0 {
		t.Errorf("%d records dropped", rep.Dropped)
	}

	// The table names both, with their roles and regions.
	var table syncBuffer
	if err := runCLI(ctx, &table, "status", "--listen", "/ip4/127.0.0.1/tcp/0", "--dht", addr); err != nil {
		t.Fatalf("status: %v", err)
	}
	for _, want := range []string{"PEER", "LAST SEEN", "dht", "eu-west", "server", "us-east", p2p.ShortID(s.Peer), "2 peers"} {
		if !strings.Contains(table.String(), want) {
			t.Errorf("table lacks %q:\n%s", want, table.String())
		}
	}

	// A DHT that does not answer is a clear error.
	var out syncBuffer
	err := runCLI(ctx, &out, "status", "--listen", "/ip4/127.0.0.1/tcp/0", "--timeout", "3s",
		"--dht", "/ip4/127.0.0.1/tcp/1/p2p/"+d.Peer)
	if err == nil || !strings.Contains(err.Error(), "join DHT") || !strings.Contains(err.Error(), "--dht") {
		t.Fatalf("status against nobody: %v", err)
	}
	if err := runCLI(ctx, &out, "status"); err == nil || !strings.Contains(err.Error(), "--dht is required") {
		t.Fatalf("status without --dht: %v", err)
	}
}

// TestDashboardCommand serves the dashboard of a one-node swarm and reads
// its JSON API.
func TestDashboardCommand(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	addr := startDHTNode(t, "--status-every", "1s")
	dctx, stop := context.WithCancel(ctx)
	var out syncBuffer
	done := make(chan error, 1)
	go func() {
		done <- runCLI(dctx, &out, "dashboard", "--dht", addr, "--listen", "127.0.0.1:0", "--every", "200ms")
	}()
	defer func() {
		stop()
		if err := <-done; err != nil {
			t.Errorf("dashboard: %v", err)
		}
	}()
	var url string
	for deadline := time.Now().Add(10 * time.Second); url == ""; time.Sleep(20 * time.Millisecond) {
		if _, rest, ok := strings.Cut(out.String(), "dashboard: "); ok {
			url, _, _ = strings.Cut(rest, " ")
		}
		if time.Now().After(deadline) {
			t.Fatalf("no address printed: %q", out.String())
		}
	}
	for deadline := time.Now().Add(15 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url+"api/swarm", nil)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		var snap struct {
			Peers []metrics.Status `json:"peers"`
		}
		err = json.NewDecoder(resp.Body).Decode(&snap)
		resp.Body.Close()
		if err != nil {
			t.Fatal(err)
		}
		if len(snap.Peers) == 1 && snap.Peers[0].Role == metrics.RoleDHT {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the dashboard shows %+v, want the DHT node", snap.Peers)
		}
	}
	if err := runCLI(ctx, &out, "dashboard", "--dht", "/ip4/127.0.0.1/tcp/1/p2p/12D3KooWEyoppNCUx8Yx66oV9fJnriXwCcXwDDUA2kj6vnc6iDEp", "--listen", "127.0.0.1:0", "--timeout", "2s"); err == nil || !strings.Contains(err.Error(), "join DHT") {
		t.Fatalf("dashboard against nobody: %v", err)
	}
}
