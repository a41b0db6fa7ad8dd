package dashboard_test

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/skyhive/skyhive/clock"
	"github.com/skyhive/skyhive/clock/clocktest"
	"github.com/skyhive/skyhive/dashboard"
	"github.com/skyhive/skyhive/metrics"
)

// fakeSource serves records a test sets.
type fakeSource struct {
	mu  sync.Mutex
	ss  []metrics.Status
	err error
}

func (f *fakeSource) set(ss []metrics.Status, err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.ss, f.err = ss, err
}

func (f *fakeSource) read(context.Context, time.Time) ([]metrics.Status, int, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.ss, 1, f.err
}

func peerRecord(at time.Time, step int64, loss float64) metrics.Status {
	return metrics.Status{Peer: "12D3KooWpeerA", Role: metrics.RolePeer, Region: "eu", Started: at.Add(-time.Minute), Time: at,
		PeriodSeconds: 5, Step: step, Loss: metrics.Float(loss)}
}

func get(t *testing.T, url string) (*http.Response, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp, string(b)
}

func TestHandler(t *testing.T) {
	if _, err := dashboard.New(dashboard.Config{}); err == nil {
		t.Fatal("a dashboard without a source was accepted")
	}
	clk := clock.NewFake(clocktest.Epoch)
	src := &fakeSource{}
	src.set([]metrics.Status{peerRecord(clocktest.Epoch, 10, 2.0)}, nil)
	d, err := dashboard.New(dashboard.Config{Source: src.read, Clock: clk})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(d)
	defer srv.Close()
	defer d.Close()
	d.Poll(context.Background())

	resp, body := get(t, srv.URL+"/")
	if resp.StatusCode != 200 || !strings.Contains(body, `src="static/app.js"`) || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/html") {
		t.Fatalf("/: %d %q", resp.StatusCode, body[:min(len(body), 200)])
	}
	if csp := resp.Header.Get("Content-Security-Policy"); !strings.Contains(csp, "default-src 'self'") {
		t.Fatalf("CSP %q", csp)
	}
	for path, want := range map[string]string{"/static/app.js": "EventSource", "/static/app.css": "--compute"} {
		if resp, body := get(t, srv.URL+path); resp.StatusCode != 200 || !strings.Contains(body, want) {
			t.Fatalf("%s: %d, no %q", path, resp.StatusCode, want)
		}
	}
	for path, code := range map[string]int{"/nothing": 404, "/static/missing.js": 404} {
		if resp, _ := get(t, srv.URL+path); resp.StatusCode != code {
			t.Fatalf("%s: %d, want %d", path, resp.StatusCode, code)
		}
	}
	if resp, err := http.Post(srv.URL+"/api/swarm", "text/plain", nil); err != nil || resp.StatusCode != http.StatusMethodNotAllowed {
		t.Fatalf("POST: %v %v", resp, err)
	}

	resp, body = get(t, srv.URL+"/api/swarm")
	var snap dashboard.Snapshot
	if err := json.Unmarshal([]byte(body), &snap); err != nil {
		t.Fatal(err)
	}
	if resp.Header.Get("Content-Type") != "application/json" || snap.Polls != 1 || snap.Dropped != 1 || len(snap.Peers) != 1 ||
		len(snap.Series) != 1 || len(snap.Series[0].Points) != 1 || snap.Append {
		t.Fatalf("/api/swarm: %s", body)
	}

	// A failed poll is reported and keeps what was seen.
	src.set(nil, errors.New("dht: no peers"))
	clk.Advance(time.Second)
	d.Poll(context.Background())
	if s := d.Snapshot(); s.Error != "dht: no peers" || len(s.Peers) != 1 {
		t.Fatalf("after a failed poll: error %q, %d peers", s.Error, len(s.Peers))
	}
}

// TestEvents reads the event stream: a full snapshot, then an update per
// poll with the new points, until the dashboard closes.
func TestEvents(t *testing.T) {
	ctx := clocktest.Context(t, 20*time.Second)
	clk := clock.NewFake(clocktest.Epoch)
	src := &fakeSource{}
	src.set([]metrics.Status{peerRecord(clocktest.Epoch, 10, 2.0)}, nil)
	d, err := dashboard.New(dashboard.Config{Source: src.read, Clock: clk})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(d)
	defer srv.Close()
	d.Poll(ctx)
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, srv.URL+"/events", nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if ct := resp.Header.Get("Content-Type"); ct != "text/event-stream" {
		t.Fatalf("content type %q", ct)
	}
	r := bufio.NewReader(resp.Body)
	next := func() (string, dashboard.Snapshot) {
		t.Helper()
		var event string
		var snap dashboard.Snapshot
		for {
			line, err := r.ReadString('\n')
			if err != nil {
				t.Fatalf("event stream: %v", err)
			}
			line = strings.TrimRight(line, "\n")
			switch {
			case strings.HasPrefix(line, "event: "):
				event = line[len("event: "):]
			case strings.HasPrefix(line, "data: "):
				if err := json.Unmarshal([]byte(line[len("data: "):]), &snap); err != nil {
					t.Fatal(err)
				}
			case line == "" && event != "":
				return event, snap
			}
		}
	}
	if ev, snap := next(); ev != "full" || len(snap.Series) != 1 || len(snap.Series[0].Points) != 1 {
		t.Fatalf("first event %q: %+v", ev, snap)
	}
	for i := range 3 {
		clk.Advance(5 * time.Second)
		at := clk.Now()
		src.set([]metrics.Status{peerRecord(at, int64(20+10*i), 1.5)}, nil)
		d.Poll(ctx)
		ev, snap := next()
		if ev != "update" || !snap.Append || len(snap.Series) != 1 || len(snap.Series[0].Points) != 1 ||
			snap.Series[0].Points[0].T != at.UnixMilli() || snap.Polls != 2+i {
			t.Fatalf("update %d: %q %+v", i, ev, snap)
		}
	}
	d.Close()
	if _, err := r.ReadString('\n'); err != io.EOF {
		t.Fatalf("after Close: %v, want the end of the stream", err)
	}
}
