package experiment

import (
	"context"
	"strings"
	"testing"
)

// TestLaunchRefusesRepeats: an experiment that runs once per seed refuses
// repeats and names the ones that take them; a negative count is refused
// by any. Both before anything runs.
func TestLaunchRefusesRepeats(t *testing.T) {
	sky, ok := Find("sky-computing")
	if !ok || sky.Repeatable {
		t.Fatalf("sky-computing: found %v, repeatable %v", ok, sky.Repeatable)
	}
	err := sky.Launch(context.Background(), Options{Out: t.TempDir(), Repeats: 2})
	if err == nil || !strings.Contains(err.Error(), "another seed") || !strings.Contains(err.Error(), geoName) {
		t.Errorf("repeats on sky-computing: %v", err)
	}
	geo, _ := Find(geoName)
	if err := geo.Launch(context.Background(), Options{Out: t.TempDir(), Repeats: -1}); err == nil || !strings.Contains(err.Error(), "-1 repeats") {
		t.Errorf("-1 repeats: %v", err)
	}
}
