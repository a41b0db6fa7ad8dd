// Package dashboardtest drives the dashboard's page in headless Chromium
// (through chromedp) for tests: package dashboard's own browser test, on
// synthetic records, and cmd/skyhive's, on a real swarm. Only tests import
// it.
package dashboardtest

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
)

// Chromium finds a Chromium or Chrome binary, or "".
func Chromium() string {
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome", "google-chrome-stable"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	return ""
}

// Require returns the browser binary, or skips the test when there is none
// or under -short. Call it before starting anything costly.
func Require(t testing.TB) string {
	t.Helper()
	exe := Chromium()
	if exe == "" {
		t.Skip("no chromium or chrome binary in PATH")
	}
	if testing.Short() {
		t.Skip("starts a browser")
	}
	return exe
}

// Browser is headless Chromium showing one page.
type Browser struct {
	t testing.TB
	// Timeout bounds each Wait (30 s).
	Timeout time.Duration

	ctx   context.Context
	close func()
	once  sync.Once
}

// Open starts exe headless in a 1400×1000 window and loads url; ctx
// bounds the browser's life. Close (or the test's cleanup) stops it.
func Open(t testing.TB, ctx context.Context, exe, url string) *Browser {
	t.Helper()
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(exe), chromedp.NoSandbox, chromedp.Headless,
		chromedp.Flag("disable-gpu", true), chromedp.Flag("disable-dev-shm-usage", true),
		chromedp.WindowSize(1400, 1000))
	actx, cancelAlloc := chromedp.NewExecAllocator(ctx, opts...)
	bctx, cancelBrowser := chromedp.NewContext(actx)
	b := &Browser{t: t, Timeout: 30 * time.Second, ctx: bctx, close: func() { cancelBrowser(); cancelAlloc() }}
	t.Cleanup(b.Close)
	if err := chromedp.Do(bctx, chromedp.Navigate(url)); err != nil {
		t.Fatalf("navigate to %s: %v", url, err)
	}
	return b
}

// Close stops the browser; later calls do nothing.
func (b *Browser) Close() { b.once.Do(b.close) }

// Wait polls the page every 100 ms until predicate, a JavaScript
// expression, is true, and fails the test with the page's text if it is
// not within Timeout.
func (b *Browser) Wait(what, predicate string) {
	b.t.Helper()
	if _, err := chromedp.Run(b.ctx, chromedp.Poll[bool](predicate,
		chromedp.WithPollingInterval(100*time.Millisecond), chromedp.WithPollingTimeout(b.Timeout))); err != nil {
		page, _ := chromedp.Run(b.ctx, chromedp.Evaluate[string](`document.body.innerText`))
		b.t.Fatalf("waiting for %s: %v\npage:\n%s", what, err, page)
	}
}

// Eval evaluates a JavaScript expression on b's page; an error fails the
// test.
func Eval[T any](b *Browser, expr string) T {
	b.t.Helper()
	v, err := chromedp.Run(b.ctx, chromedp.Evaluate[T](expr))
	if err != nil {
		b.t.Fatalf("evaluate %s: %v", expr, err)
	}
	return v
}

// Screenshot saves a screenshot of the whole page as name in
// $SKYHIVE_ARTIFACTS (else the test's temporary directory) and, if the
// environment variable env names a file, there too; it returns the paths.
func (b *Browser) Screenshot(name, env string) []string {
	b.t.Helper()
	png, err := chromedp.Run(b.ctx, chromedp.FullScreenshot(100))
	if err != nil {
		b.t.Fatalf("screenshot: %v", err)
	}
	dir := os.Getenv("SKYHIVE_ARTIFACTS")
	if dir == "" {
		dir = b.t.TempDir()
	} else if err := os.MkdirAll(dir, 0o755); err != nil {
		b.t.Fatal(err)
	}
	paths := []string{filepath.Join(dir, name)}
	if p := os.Getenv(env); env != "" && p != "" {
		paths = append(paths, p)
	}
	for _, p := range paths {
		if err := os.WriteFile(p, png, 0o644); err != nil {
			b.t.Fatal(err)
		}
		b.t.Logf("screenshot: %s", p)
	}
	return paths
}
