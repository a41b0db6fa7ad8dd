package metrics

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/skyhive/skyhive/dht"
)

// StartCPUProfile writes a gzipped profile when stopped; no path starts
// nothing, and a path it cannot create is an error.
func TestStartCPUProfile(t *testing.T) {
	if stop, err := StartCPUProfile(""); stop != nil || err != nil {
		t.Fatalf("no path: %v, %v", stop != nil, err)
	}
	if _, err := StartCPUProfile(filepath.Join(t.TempDir(), "no", "cpu.prof")); err == nil {
		t.Fatal("a profile in a missing directory started")
	}
	path := filepath.Join(t.TempDir(), "cpu.prof")
	stop, err := StartCPUProfile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(path); err != nil || len(b) < 2 || b[0] != 0x1f || b[1] != 0x8b {
		t.Fatalf("%s is not a gzipped profile: %v", path, err)
	}
}

// noRecords is a DHT without status records.
type noRecords struct{}

func (noRecords) Get(context.Context, string) (map[string]dht.Item, error) { return nil, nil }

// A report without records has an empty list of peers, which JSON shows
// as [], at the time read, in UTC.
func TestReadStatusReportEmpty(t *testing.T) {
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.FixedZone("X", 3600))
	r, err := ReadStatusReport(context.Background(), noRecords{}, now)
	if err != nil || r.Peers == nil || len(r.Peers) != 0 || r.Dropped != 0 || !r.Time.Equal(now) || r.Time.Location() != time.UTC {
		t.Fatalf("%+v, %v", r, err)
	}
}
