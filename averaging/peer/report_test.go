package peer

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"

	"github.com/skyhive/skyhive/p2p"
)

// A peer's result is one JSON line in the benchmark protocol, test
// accuracy for an image classifier and validation perplexity for a
// language model, or a sentence.
func TestResultReport(t *testing.T) {
	id := "12D3KooWHtz3SAKgN44ngiGCvvvWoaPiiymfDZXhSqyjw3q17bWd"
	for _, c := range []struct {
		r              Result
		metric, phrase string
	}{
		{Result{Peer: id, Algo: "wagma", TestAccuracy: 0.8, Steps: 5}, "test_accuracy", "test accuracy 80.00%"},
		{Result{Peer: id, Algo: "diloco", Model: "gpt-mini", ValPerplexity: 42, Steps: 5}, "val_perplexity", "validation perplexity 42.00"},
	} {
		var b bytes.Buffer
		if err := c.r.Report(&b, true); err != nil {
			t.Fatal(err)
		}
		var line map[string]any
		if err := json.Unmarshal(b.Bytes(), &line); err != nil {
			t.Fatal(err)
		}
		if line["suite"] != "peer" || line["case"] != c.r.Algo || line["metric"] != c.metric || line["peer"] != id || line["steps"] != 5.0 {
			t.Errorf("JSON line %v", line)
		}
		b.Reset()
		if err := c.r.Report(&b, false); err != nil {
			t.Fatal(err)
		}
		if s := b.String(); !strings.Contains(s, c.phrase) || !strings.Contains(s, p2p.ShortID(id)) || strings.Contains(s, id) {
			t.Errorf("sentence %q, want %q and the short ID", s, c.phrase)
		}
	}
	var b bytes.Buffer
	Launched{Algo: "wagma", Dir: "/tmp/run/", Peers: []Result{{Peer: id, TestAccuracy: 0.5}}, MeanAccuracy: 0.5}.Report(&b)
	if s := b.String(); !strings.Contains(s, "test accuracy 50.00%") || !strings.Contains(s, "wagma: mean test accuracy of 1 peers 50.00% (logs: /tmp/run)") {
		t.Errorf("launch report %q", s)
	}
}
