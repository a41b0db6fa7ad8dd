// Package dashboard is the web page of `skyhive dashboard`: it polls the
// swarm's status records (package metrics) every few seconds, keeps a
// bounded history per peer, and serves a page that updates live over
// server-sent events. The page and its script and style are embedded in
// the binary and load nothing from elsewhere, so it works without
// internet access.
//
// Routes: / (the page), /static/ (its script and style), /api/swarm (the
// current snapshot with the whole history, JSON) and /events (an SSE
// stream: a "full" snapshot, then an "update" after every poll with the
// points it added).
package dashboard

import (
	"context"
	"embed"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net/http"
	"sync"
	"time"

	"github.com/skyhive/skyhive/clock"
	"github.com/skyhive/skyhive/metrics"
)

//go:embed assets
var assets embed.FS

// Source reads the swarm's status records at now: metrics.ReadStatus on a
// DHT node. It returns the valid records and how many it dropped.
type Source func(ctx context.Context, now time.Time) ([]metrics.Status, int, error)

// Config configures a Dashboard. Zero fields take the defaults noted.
type Config struct {
	// Source reads the records (required).
	Source Source
	// Every is the polling interval (3 s).
	Every time.Duration
	// Points bounds each peer's curve (600 points: half an hour of
	// records published every 3 s), Peers the peers tracked (1024);
	// Forget drops a peer not seen for this long (10 min).
	Points int
	Peers  int
	Forget time.Duration
	// Heartbeat is how often an idle event stream gets a comment, so that
	// proxies keep it open (15 s).
	Heartbeat time.Duration
	// Clock is the dashboard's time (nil: the wall clock).
	Clock clock.Clock
}

// Dashboard polls the records and serves the page. Its methods are safe
// for concurrent use.
type Dashboard struct {
	cfg    Config
	clk    clock.Clock
	static http.Handler
	page   []byte

	mu      sync.Mutex
	hist    *history
	polls   int
	lastErr string
	dropped int
	update  []byte        // the last poll's update event
	changed chan struct{} // closed and replaced after every poll
	done    chan struct{} // closed by Close
	closed  bool
}

// New returns a dashboard; Run polls.
func New(cfg Config) (*Dashboard, error) {
	if cfg.Source == nil {
		return nil, errors.New("dashboard: no source of status records")
	}
	if cfg.Every <= 0 {
		cfg.Every = 3 * time.Second
	}
	if cfg.Points <= 0 {
		cfg.Points = 600
	}
	if cfg.Peers <= 0 {
		cfg.Peers = 1024
	}
	if cfg.Forget <= 0 {
		cfg.Forget = 10 * time.Minute
	}
	if cfg.Heartbeat <= 0 {
		cfg.Heartbeat = 15 * time.Second
	}
	static, err := fs.Sub(assets, "assets")
	if err != nil {
		return nil, err
	}
	page, err := fs.ReadFile(static, "index.html")
	if err != nil {
		return nil, err
	}
	return &Dashboard{
		cfg: cfg, clk: clock.Or(cfg.Clock), static: http.StripPrefix("/static/", http.FileServerFS(static)), page: page,
		hist: newHistory(cfg.Points, cfg.Peers, cfg.Forget), changed: make(chan struct{}), done: make(chan struct{}),
	}, nil
}

// Run polls now and then every Every until ctx ends, and returns nil then.
// A failed poll is shown on the page and retried at the next.
func (d *Dashboard) Run(ctx context.Context) error {
	for {
		d.Poll(ctx)
		if err := d.clk.Sleep(ctx, d.cfg.Every); err != nil {
			return nil
		}
	}
}

// Poll reads the records once and tells the event streams.
func (d *Dashboard) Poll(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, max(2*d.cfg.Every, 10*time.Second))
	defer cancel()
	now := d.clk.Now()
	ss, dropped, err := d.cfg.Source(ctx, now)
	d.mu.Lock()
	defer d.mu.Unlock()
	d.polls++
	d.lastErr = ""
	if err != nil {
		d.lastErr = err.Error()
		ss = nil // keep the history; peers age until forgotten
	} else {
		d.dropped = dropped
	}
	d.hist.add(now, ss)
	d.update = d.encodeLocked(now, true)
	close(d.changed)
	d.changed = make(chan struct{})
}

// Snapshot returns the swarm as of the last poll, with the whole history.
func (d *Dashboard) Snapshot() Snapshot {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.snapshotLocked(d.clk.Now(), false)
}

func (d *Dashboard) snapshotLocked(now time.Time, update bool) Snapshot {
	s := d.hist.build(now, update)
	s.Polls, s.Error, s.Dropped = d.polls, d.lastErr, d.dropped
	return s
}

func (d *Dashboard) encodeLocked(now time.Time, update bool) []byte {
	b, err := json.Marshal(d.snapshotLocked(now, update))
	if err != nil {
		// Records are validated, so this cannot happen; say so on the page.
		b, _ = json.Marshal(Snapshot{Time: now, Error: "encoding the snapshot: " + err.Error()})
	}
	return b
}

// Close ends the event streams (an http.Server's Shutdown waits for them).
func (d *Dashboard) Close() {
	d.mu.Lock()
	defer d.mu.Unlock()
	if !d.closed {
		d.closed = true
		close(d.done)
	}
}

// ServeHTTP serves the page, its assets, the JSON API and the events.
func (d *Dashboard) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	h := w.Header()
	// The page shows what peers wrote about themselves: no script, style
	// or connection may come from anywhere but the dashboard.
	h.Set("Content-Security-Policy", "default-src 'self'; img-src 'self' data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Referrer-Policy", "no-referrer")
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		h.Set("Allow", "GET, HEAD")
		http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
		return
	}
	switch p := r.URL.Path; {
	case p == "/":
		h.Set("Content-Type", "text/html; charset=utf-8")
		h.Set("Cache-Control", "no-cache")
		_, _ = w.Write(d.page)
	case len(p) > len("/static/") && p[:len("/static/")] == "/static/":
		h.Set("Cache-Control", "no-cache")
		d.static.ServeHTTP(w, r)
	case p == "/api/swarm":
		d.mu.Lock()
		b := d.encodeLocked(d.clk.Now(), false)
		d.mu.Unlock()
		h.Set("Content-Type", "application/json")
		h.Set("Cache-Control", "no-store")
		_, _ = w.Write(b)
	case p == "/events":
		d.serveEvents(w, r)
	default:
		http.NotFound(w, r)
	}
}

// serveEvents streams a full snapshot, then an update after every poll,
// until the client goes, the server shuts down or Close is called.
func (d *Dashboard) serveEvents(w http.ResponseWriter, r *http.Request) {
	rc := http.NewResponseController(w)
	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-store")
	d.mu.Lock()
	full, changed := d.encodeLocked(d.clk.Now(), false), d.changed
	d.mu.Unlock()
	send := func(event string, data []byte) bool {
		if _, err := fmt.Fprintf(w, "event: %s\ndata: %s\n\n", event, data); err != nil {
			return false
		}
		return rc.Flush() == nil
	}
	if !send("full", full) {
		return
	}
	beat := time.NewTicker(d.cfg.Heartbeat)
	defer beat.Stop()
	for {
		select {
		case <-r.Context().Done():
			return
		case <-d.done:
			return
		case <-beat.C:
			if _, err := fmt.Fprint(w, ": keep-alive\n\n"); err != nil || rc.Flush() != nil {
				return
			}
		case <-changed:
			d.mu.Lock()
			update := d.update
			changed = d.changed
			d.mu.Unlock()
			if !send("update", update) {
				return
			}
		}
	}
}
