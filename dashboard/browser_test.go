package dashboard_test

import (
	"context"
	"fmt"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/skyhive/skyhive/dashboard"
	"github.com/skyhive/skyhive/dashboard/dashboardtest"
)

// TestDashboardInBrowser drives the dashboard in headless Chromium against
// a small swarm on loopback: the page lists every peer, draws a loss curve
// that grows as the records change, and fills the expert, pipeline and
// averaging sections. It saves a screenshot in $SKYHIVE_ARTIFACTS (else the
// test's temporary directory) and, if $SKYHIVE_DASHBOARD_PNG names a file,
// there too. TestDashboardOfRealSwarm (cmd/skyhive) does the same against
// real peer processes training.
func TestDashboardInBrowser(t *testing.T) {
	exe := dashboardtest.Require(t)
	start := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	ls := startSwarm(t, ctx, 400*time.Millisecond, demoMembers())
	d, err := dashboard.New(dashboard.Config{Source: ls.read, Every: 400 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(d)
	defer srv.Close()
	defer d.Close() // ends the event stream before the server waits for it
	polled := make(chan struct{})
	pctx, stopPolls := context.WithCancel(ctx)
	go func() { defer close(polled); _ = d.Run(pctx) }()
	defer func() { stopPolls(); <-polled }()

	b := dashboardtest.Open(t, ctx, exe, srv.URL)
	defer b.Close()
	wait := b.Wait
	// Every peer's row, with its role.
	for _, id := range ls.ids {
		wait("peer "+id, fmt.Sprintf(`!!document.querySelector('#peers tbody tr[data-peer=%q]')`, id))
	}
	wait("the peer count", fmt.Sprintf(`document.getElementById('peer-count').textContent === '%d'`, len(ls.ids)))
	// A loss curve that updates: its points grow as new records arrive.
	wait("a loss curve", `Number(document.getElementById('loss-chart').dataset.points) >= 4`)
	first := dashboardtest.Eval[int](b, `Number(document.getElementById('loss-chart').dataset.points)`)
	wait("the loss curve to grow", fmt.Sprintf(`Number(document.getElementById('loss-chart').dataset.points) > %d`, first+3))
	// The other sections have what the records carry.
	wait("the expert grid", `document.querySelectorAll('#grids .cell[data-uid]').length === 64`)
	wait("the pipeline stages", `document.querySelectorAll('#pipelines .bars[data-stage]').length === 4`)
	wait("the averaging run", `document.querySelectorAll('#runs tr[data-peer]').length === 3`)
	wait("links between peers", `document.querySelectorAll('#map line').length > 0`)
	for _, empty := range []string{"peers-empty", "curves-empty", "experts-empty", "pipeline-empty", "averaging-empty"} {
		wait(empty+" hidden", fmt.Sprintf(`document.getElementById(%q).hidden`, empty))
	}
	// Let a few more points accumulate so the curves show a trend.
	wait("a longer curve", fmt.Sprintf(`Number(document.getElementById('loss-chart').dataset.points) > %d`, first+24))
	b.Screenshot("dashboard.png", "SKYHIVE_DASHBOARD_PNG")
	t.Logf("browser test took %v", time.Since(start).Round(time.Millisecond))
}
