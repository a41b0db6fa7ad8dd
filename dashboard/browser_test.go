package dashboard_test

import (
	"context"
	"fmt"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/skyhive/skyhive/dashboard"
)

// chromium finds a Chromium or Chrome binary, or "".
func chromium() string {
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome", "google-chrome-stable"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	return ""
}

// TestDashboardInBrowser drives the dashboard in headless Chromium against
// a small swarm on loopback: the page lists every peer, draws a loss curve
// that grows as the records change, and fills the expert, pipeline and
// averaging sections. It saves a screenshot in $SKYHIVE_ARTIFACTS (else the
// test's temporary directory) and, if $SKYHIVE_DASHBOARD_PNG names a file,
// there too (docs/img/dashboard.png is made that way).
func TestDashboardInBrowser(t *testing.T) {
	exe := chromium()
	if exe == "" {
		t.Skip("no chromium or chrome binary in PATH")
	}
	if testing.Short() {
		t.Skip("starts a browser")
	}
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

	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(exe), chromedp.NoSandbox, chromedp.Headless,
		chromedp.Flag("disable-gpu", true), chromedp.Flag("disable-dev-shm-usage", true),
		chromedp.WindowSize(1400, 1000))
	actx, cancelAlloc := chromedp.NewExecAllocator(ctx, opts...)
	defer cancelAlloc()
	bctx, cancelBrowser := chromedp.NewContext(actx)
	defer cancelBrowser()
	if err := chromedp.Do(bctx, chromedp.Navigate(srv.URL)); err != nil {
		t.Fatalf("navigate: %v", err)
	}
	wait := func(what, predicate string) {
		t.Helper()
		if _, err := chromedp.Run(bctx, chromedp.Poll[bool](predicate,
			chromedp.WithPollingInterval(100*time.Millisecond), chromedp.WithPollingTimeout(30*time.Second))); err != nil {
			page, _ := chromedp.Run(bctx, chromedp.Evaluate[string](`document.body.innerText`))
			t.Fatalf("waiting for %s: %v\npage:\n%s", what, err, page)
		}
	}
	// Every peer's row, with its role.
	for _, id := range ls.ids {
		wait("peer "+id, fmt.Sprintf(`!!document.querySelector('#peers tbody tr[data-peer=%q]')`, id))
	}
	wait("the peer count", fmt.Sprintf(`document.getElementById('peer-count').textContent === '%d'`, len(ls.ids)))
	// A loss curve that updates: its points grow as new records arrive.
	wait("a loss curve", `Number(document.getElementById('loss-chart').dataset.points) >= 4`)
	first, err := chromedp.Run(bctx, chromedp.Evaluate[int](`Number(document.getElementById('loss-chart').dataset.points)`))
	if err != nil {
		t.Fatal(err)
	}
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
	png, err := chromedp.Run(bctx, chromedp.FullScreenshot(100))
	if err != nil {
		t.Fatalf("screenshot: %v", err)
	}
	dir := os.Getenv("SKYHIVE_ARTIFACTS")
	if dir == "" {
		dir = t.TempDir()
	} else if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	paths := []string{filepath.Join(dir, "dashboard.png")}
	if p := os.Getenv("SKYHIVE_DASHBOARD_PNG"); p != "" {
		paths = append(paths, p)
	}
	for _, p := range paths {
		if err := os.WriteFile(p, png, 0o644); err != nil {
			t.Fatal(err)
		}
		t.Logf("screenshot: %s", p)
	}
	t.Logf("browser test took %v", time.Since(start).Round(time.Millisecond))
}
