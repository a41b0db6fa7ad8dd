package pipeline

import "testing"

func TestUniqueName(t *testing.T) {
	taken := map[string]bool{"node1": true, "node1-2": true}
	if got := uniqueName("node1", func(n string) bool { return taken[n] }); got != "node1-3" {
		t.Fatalf("got %q, want node1-3", got)
	}
	if got := uniqueName("node2", func(n string) bool { return taken[n] }); got != "node2" {
		t.Fatalf("got %q, want node2", got)
	}
}
