package server

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"
)

// TestServerQuietByDefault checks the lines a busy 640-expert server writes
// in ten minutes at its defaults (a summary every 30 s, a table of the
// busiest experts on exit, repeated warnings counted): under 100.
func TestServerQuietByDefault(t *testing.T) {
	st := Stats{UptimeSeconds: 30, LastDeclared: time.Now()}
	for i := range 640 {
		e := ExpertStats{UID: fmt.Sprintf("ffn.%d.%d", i/32, i%32), Updates: int64(i)}
		e.Forward = CallStats{Requests: int64(i + 1), Batches: 1, Rows: 4}
		e.Backward = CallStats{Requests: int64(i + 1), Batches: 1, Rows: 4, Errors: int64(i % 3)}
		st.Experts = append(st.Experts, e)
	}
	var out bytes.Buffer
	logs := newQuietHandler(slog.NewTextHandler(&out, &slog.HandlerOptions{Level: slog.LevelWarn}), false)
	log := slog.New(logs)
	for range 20 {
		for i := range 300 { // a warning storm: every expert step skipped, declarations failing
			log.Warn("expert step skipped: gradients not finite; weights unchanged", "expert", st.Experts[i].UID)
			if i%100 == 0 {
				log.Warn("declare experts", "failed", 3)
			}
		}
		printServerSummary(&out, st)
		logs.flush(context.Background())
	}
	printServerStats(&out, st, busiestShown)
	lines := strings.Count(out.String(), "\n")
	if lines >= 100 {
		t.Fatalf("%d lines in ten minutes, want under 100:\n%s", lines, out.String())
	}
	if !strings.Contains(out.String(), "640 of 640 experts called") || !strings.Contains(out.String(), "300 times since") ||
		!strings.Contains(out.String(), "ffn.19.31") || !strings.Contains(out.String(), "… and 630 more experts called") {
		t.Fatalf("the summary, the counted warnings or the busiest expert are missing:\n%s", out.String())
	}
	// --verbose writes everything.
	out.Reset()
	loud := newQuietHandler(slog.NewTextHandler(&out, nil), true)
	for range 5 {
		slog.New(loud).Warn("declare experts")
	}
	if n := strings.Count(out.String(), "declare experts"); n != 5 {
		t.Fatalf("--verbose wrote %d of 5 warnings", n)
	}
}

// TestServerLazyByDefault checks that the server creates large expert
// grids lazily unless told otherwise, and the default grid at once.
func TestServerLazyByDefault(t *testing.T) {
	if lazyByDefault(16, "ffn", DefaultHidden) || lazyByDefault(256, "ffn", DefaultHidden) {
		t.Error("the default grid or a 16×16 grid of default experts would be created lazily")
	}
	if !lazyByDefault(256, "ffn", 1024) {
		t.Error("256 experts of hidden 1024 (34 GiB) would be created at start")
	}
}
