package swarm

import (
	"path/filepath"
	"testing"

	"github.com/skyhive/skyhive/launch"
)

// The example specs load, each class's config decoded into its role's
// typed config, and "{i}" in a config becomes the peer's index.
func TestExampleSpecsLoad(t *testing.T) {
	paths, err := filepath.Glob("../examples/swarm/*.json")
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, p := range paths {
		if filepath.Base(p) == "regions.json" {
			continue
		}
		s, err := LoadSpec(p)
		if err != nil {
			t.Errorf("%s: %v", p, err)
			continue
		}
		n++
		for _, ps := range s.Peers() {
			if c, ok := ps.Config.(*launch.Server); ok && c.Experts != "ffn."+string(rune('0'+ps.ClassIndex))+".[0:4]" {
				t.Errorf("%s: %s serves %q", p, ps.Name, c.Experts)
			}
		}
	}
	if n < 4 {
		t.Errorf("%d example specs", n)
	}
}
