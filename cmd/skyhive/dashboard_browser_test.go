package main

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/skyhive/skyhive/dashboard/dashboardtest"
	"github.com/skyhive/skyhive/p2p"
)

// TestDashboardOfRealSwarm drives the dashboard in headless Chromium
// against a real swarm on loopback: a `skyhive dht` process (region eu)
// and two `skyhive peer` processes training mlp-small on Fashion-MNIST
// (regions eu and us), read by `skyhive dashboard` in this process. It
// waits for both peers' rows with their role and region, for the loss
// curve to gain points between two observations and for the accuracy
// curve, then saves dashboard-swarm.png in $SKYHIVE_ARTIFACTS (else the
// test's temporary directory) and, if $SKYHIVE_DASHBOARD_PNG names a
// file, there too (docs/img/dashboard.png is made that way). The
// processes it started are killed when it ends.
func TestDashboardOfRealSwarm(t *testing.T) {
	exe := dashboardtest.Require(t)
	needFashionMNIST(t)
	if raceEnabled {
		t.Skip("trains two peers for half a minute")
	}
	start := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()

	_, dhtAddr, _ := startListening(t, "dht", "--listen", loopback, "--region", "eu", "--status-every", "1s")
	dir := t.TempDir()
	regions := []string{"eu", "us"}
	ids := make([]string, len(regions))
	for i, region := range regions {
		key := filepath.Join(dir, fmt.Sprintf("peer%d.key", i))
		priv, err := p2p.LoadOrCreateIdentity(key)
		if err != nil {
			t.Fatal(err)
		}
		id, err := peer.IDFromPrivateKey(priv)
		if err != nil {
			t.Fatal(err)
		}
		ids[i] = id.String()
		// Killed by startCLI's cleanup, if not done by then.
		startCLI(t, nil, "peer", "--dht", dhtAddr, "--listen", loopback, "--identity", key, "--region", region,
			"--run-id", "dashboard", "--model", "mlp-small", "--limit", "2000", "--eval-every", "2s", "--eval-examples", "500",
			"--status-every", "1s", "--duration", "60s", "--quiet")
	}

	dctx, stop := context.WithCancel(ctx)
	var out syncBuffer
	done := make(chan error, 1)
	go func() {
		done <- runCLI(dctx, &out, "dashboard", "--dht", dhtAddr, "--listen", "127.0.0.1:0", "--every", "500ms")
	}()
	defer func() {
		stop()
		if err := <-done; err != nil {
			t.Errorf("dashboard: %v\n%s", err, out.String())
		}
	}()
	var url string
	for deadline := time.Now().Add(20 * time.Second); url == ""; time.Sleep(20 * time.Millisecond) {
		if _, rest, ok := strings.Cut(out.String(), "dashboard: "); ok {
			url, _, _ = strings.Cut(rest, " ")
		}
		if time.Now().After(deadline) {
			t.Fatalf("no address printed: %q", out.String())
		}
	}

	b := dashboardtest.Open(t, ctx, exe, url)
	defer b.Close()
	// Both peers, with role and region, and the DHT node.
	for i, id := range ids {
		row := fmt.Sprintf(`document.querySelector('#peers tbody tr[data-peer=%q]')`, id)
		b.Wait("peer "+id, fmt.Sprintf(`!!%s && %[1]s.children[1].textContent === 'peer' && %[1]s.children[2].textContent === %q`, row, regions[i]))
	}
	b.Wait("the DHT node", `[...document.querySelectorAll('#peers tbody tr')].some(tr => tr.children[1].textContent === 'dht')`)
	// A loss curve that updates as the peers train.
	const lossPoints = `Number(document.getElementById('loss-chart').dataset.points)`
	b.Wait("a loss curve", lossPoints+` >= 2`)
	first := dashboardtest.Eval[int](b, lossPoints)
	b.Wait("the loss curve to grow", fmt.Sprintf(`%s > %d`, lossPoints, first))
	second := dashboardtest.Eval[int](b, lossPoints)
	b.Wait("an accuracy curve", `Number(document.getElementById('accuracy-chart').dataset.points) >= 2`)
	// A few more points, so that the screenshot shows a trend.
	b.Wait("a longer curve", fmt.Sprintf(`%s >= %d`, lossPoints, second+24))
	b.Screenshot("dashboard-swarm.png", "SKYHIVE_DASHBOARD_PNG")
	t.Logf("loss points %d, then %d; the test took %v", first, second, time.Since(start).Round(time.Millisecond))
}
