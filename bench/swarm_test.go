package bench

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/skyhive/skyhive/swarm"
)

// WriteSwarm prints a run as text with its benchmark numbers, or as the
// benchmark protocol's JSON lines.
func TestWriteSwarm(t *testing.T) {
	acc := 0.8
	r := &swarm.RunResult{Name: "demo", Isolation: "processes", Seconds: 12.5,
		Peers: []swarm.PeerResult{{Name: "p0", Role: "peer", State: "finished", TestAccuracy: &acc}}}
	var text strings.Builder
	WriteSwarm(&text, r, false)
	for _, want := range []string{"demo", "test_accuracy: 0.8 fraction", "finished: 1 peers"} {
		if !strings.Contains(text.String(), want) {
			t.Errorf("text has no %q:\n%s", want, text.String())
		}
	}
	var lines strings.Builder
	WriteSwarm(&lines, r, true)
	rows := strings.Split(strings.TrimSpace(lines.String()), "\n")
	if len(rows) != len(SwarmResults(r)) {
		t.Fatalf("%d JSON lines, want %d:\n%s", len(rows), len(SwarmResults(r)), lines.String())
	}
	var first Result
	if err := json.Unmarshal([]byte(rows[0]), &first); err != nil || first.Suite != "swarm" || first.Case != "demo" || first.Metric != "seconds" {
		t.Errorf("first line %q: %+v, %v", rows[0], first, err)
	}
}
