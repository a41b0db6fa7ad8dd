package swarm

import (
	"image/png"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// The summary chart of a hand-made run is a valid PNG, with bytes when the
// run counted them and accuracy or starts when it did not.
// $SWARM_SUMMARY_OUT, if set, keeps the first chart there.
func TestWriteSummaryPNG(t *testing.T) {
	acc := func(a float64) *float64 { return &a }
	r := &RunResult{
		Name: "averaging", Isolation: IsolationNamespaces, Seconds: 62.3,
		Peers: []PeerResult{
			{Name: "dht", Role: RoleDHT, Region: "eu", State: StateStopped, Starts: 1, Sent: 2e6, Received: 3e6},
			{Name: "p1", Role: RolePeer, Region: "eu", State: StateExited, Starts: 1, Sent: 120e6, Received: 118e6, TestAccuracy: acc(0.842)},
			{Name: "p2", Role: RolePeer, Region: "us", State: StateExited, Starts: 2, Sent: 80e6, Received: 83e6, TestAccuracy: acc(0.835)},
			{Name: "p3", Role: RolePeer, Region: "us", NAT: true, State: StateKilled, Starts: 1, Sent: 40e6, Received: 41e6},
		},
		Events: []Event{
			{At: 10 * time.Second, Fired: 10*time.Second + 3*time.Millisecond, Action: ActionKill, Peer: "p3"},
			{At: 5 * time.Second, Fired: 5 * time.Second, Action: ActionSlowdown, Peer: "p2", Factor: 4},
			{At: 20 * time.Second, Fired: 20 * time.Second, Action: ActionKill, Peer: "p2"},
			{At: 30 * time.Second, Fired: 30 * time.Second, Action: ActionRejoin, Peer: "p2"},
			{At: 40 * time.Second, Fired: 40 * time.Second, Action: ActionPause, Peer: "p2", Error: "no such process"},
		},
	}
	dir := t.TempDir()
	check := func(path string) {
		t.Helper()
		f, err := os.Open(path)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		img, err := png.Decode(f)
		if err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		if b := img.Bounds(); b.Dx() < 400 || b.Dy() < 300 {
			t.Fatalf("%s is %v", path, b)
		}
	}
	path := filepath.Join(dir, SummaryFile)
	if out := os.Getenv("SWARM_SUMMARY_OUT"); out != "" {
		path = out
	}
	if err := WriteSummaryPNG(path, r); err != nil {
		t.Fatal(err)
	}
	check(path)

	// Processes: no bytes, accuracy instead; then neither.
	for i := range r.Peers {
		r.Peers[i].Sent, r.Peers[i].Received = 0, 0
	}
	r.Isolation = IsolationProcesses
	path = filepath.Join(dir, "accuracy.png")
	if err := WriteSummaryPNG(path, r); err != nil {
		t.Fatal(err)
	}
	check(path)
	for i := range r.Peers {
		r.Peers[i].TestAccuracy = nil
	}
	r.Events = nil
	path = filepath.Join(dir, "starts.png")
	if err := WriteSummaryPNG(path, r); err != nil {
		t.Fatal(err)
	}
	check(path)

	if err := WriteSummaryPNG(filepath.Join(dir, "none.png"), &RunResult{}); err == nil {
		t.Error("drew a run without peers")
	}
	label := peerLabel(r.Peers[2], []Event{{Action: ActionKill}, {Action: ActionRejoin}, {Action: ActionKill}, {Action: ActionRejoin}, {Action: ActionKill}})
	if !strings.Contains(label, "+2 more") || strings.Count(label, "\n") != 6 {
		t.Errorf("label %q", label)
	}
}
