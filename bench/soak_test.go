package bench

import (
	"context"
	"encoding/json"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/skyhive/skyhive/averaging/peer"
)

// TestAnalyzeSoak feeds the analysis stats files: one flat peer with
// garbage-collection peaks, one whose memory and goroutines grow.
func TestAnalyzeSoak(t *testing.T) {
	dir := t.TempDir()
	write := func(i int, rss func(s float64) int64, gor func(s float64) int) {
		f, err := os.Create(peer.StatsFile(dir, i))
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		enc := json.NewEncoder(f)
		for s := 0.0; s <= 600; s += 10 {
			enc.Encode(peer.Snapshot{Seconds: s, RSSBytes: rss(s), Goroutines: gor(s)})
		}
		enc.Encode(peer.Snapshot{Seconds: 601, Final: &peer.Result{}})
	}
	flat := func(s float64) int64 {
		if int(s)%150 == 0 {
			return 800 << 20 // an evaluation's peak
		}
		return 500 << 20
	}
	write(0, flat, func(float64) int { return 50 })
	rs, err := AnalyzeSoak(dir, 1, 10*time.Minute, peer.Launched{})
	if err != nil {
		t.Fatal(err)
	}
	if rs[0].Value > 0.001 || rs[2].Value != 0 {
		t.Fatalf("flat peer: %+v", rs)
	}
	write(1, func(s float64) int64 { return int64(500+s) << 20 }, func(s float64) int { return 50 + int(s/60) })
	rs, err = AnalyzeSoak(dir, 2, 10*time.Minute, peer.Launched{})
	if err != nil {
		t.Fatal(err)
	}
	if rs[0].Value < 0.5 || rs[2].Value < 5 {
		t.Fatalf("growing peer not caught: %+v", rs)
	}
}

// TestSoakTooShortRefusedFirst checks that a soak too short to be judged
// is refused before any peer starts.
func TestSoakTooShortRefusedFirst(t *testing.T) {
	start := time.Now()
	_, err := runSoak(context.Background(), Options{Duration: time.Minute})
	if err == nil || !strings.Contains(err.Error(), "a soak of 1m0s is too short") {
		t.Fatalf("a 1-minute soak: %v, want it refused as too short", err)
	}
	if d := time.Since(start); d > time.Second {
		t.Fatalf("refused after %v, want at once", d)
	}
	if err := CheckSoakDuration(MinSoakDuration); err != nil {
		t.Fatal(err)
	}
}
