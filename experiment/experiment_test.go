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
	moe, ok := Find("moe-convergence")
	if !ok || moe.Repeatable {
		t.Fatalf("moe-convergence: found %v, repeatable %v", ok, moe.Repeatable)
	}
	err := moe.Launch(context.Background(), Options{Out: t.TempDir(), Repeats: 2})
	if err == nil || !strings.Contains(err.Error(), "another seed") || !strings.Contains(err.Error(), geoName) || !strings.Contains(err.Error(), "sky-computing") {
		t.Errorf("repeats on moe-convergence: %v", err)
	}
	geo, _ := Find(geoName)
	if err := geo.Launch(context.Background(), Options{Out: t.TempDir(), Repeats: -1}); err == nil || !strings.Contains(err.Error(), "-1 repeats") {
		t.Errorf("-1 repeats: %v", err)
	}
}
