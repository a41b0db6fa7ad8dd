package pipeline

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/skyhive/skyhive/launch"
	"github.com/skyhive/skyhive/netem"
)

// A coordinator's typed config becomes its TrainConfig, checked: a run
// with no workers, a bad schedule and bad training options are refused.
func TestTrainConfigFrom(t *testing.T) {
	c := launch.Pipeline{Model: "mlp", Workers: 2, Schedule: "gpipe", Micro: 2, Compare: "even,skyhive", IterTimeout: launch.Duration(time.Second),
		Training: launch.Training{Epochs: 1, Batch: 32, LR: 1e-3, Steps: 7}}
	cfg, err := TrainConfigFrom(c)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Schedule != GPipe || cfg.Micro != 2 || cfg.Steps != 7 || cfg.IterTimeout != time.Second || !slices.Equal(cfg.Compare, []string{"even", "skyhive"}) {
		t.Fatalf("config %+v", cfg)
	}
	for _, bad := range []struct {
		edit func(*launch.Pipeline)
		want string
	}{
		{func(c *launch.Pipeline) { c.Workers = 0 }, "needs workers N"},
		{func(c *launch.Pipeline) { c.Schedule = "zigzag" }, "zigzag"},
		{func(c *launch.Pipeline) { c.Batch = 0 }, "batch size must be positive"},
	} {
		b := c
		bad.edit(&b)
		if _, err := TrainConfigFrom(b); err == nil || !strings.Contains(err.Error(), bad.want) {
			t.Errorf("got %v, want an error about %q", err, bad.want)
		}
	}
}

// Emulate places the local workers round-robin over the profile's regions
// and the coordinator in the first, unless told otherwise, and refuses
// links with no local workers or regions that do not match them.
func TestScenarioEmulate(t *testing.T) {
	link := netem.LinkParams{Latency: time.Millisecond, Bandwidth: 1e8}
	prof := &netem.Profile{Regions: []string{"a", "b"}, Intra: link, Inter: [][]netem.LinkParams{{{}, link}, {link, {}}}}
	cfg := ScenarioConfig{Slowdowns: []float64{1, 2, 3}}
	if err := cfg.Emulate(prof, nil, "", 1); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(cfg.Regions, []string{"a", "b", "a"}) || cfg.Coordinator.Region != "a" || cfg.Coordinator.Network == nil {
		t.Fatalf("regions %v, coordinator in %q", cfg.Regions, cfg.Coordinator.Region)
	}
	if err := cfg.Emulate(prof, []string{"b", "b", "a"}, "b", 1); err != nil || cfg.Regions[0] != "b" || cfg.Coordinator.Region != "b" {
		t.Fatalf("given regions: %v, %v, coordinator in %q", err, cfg.Regions, cfg.Coordinator.Region)
	}
	if err := cfg.Emulate(prof, []string{"a"}, "", 1); err == nil {
		t.Error("1 region for 3 workers accepted")
	}
	if err := (&ScenarioConfig{}).Emulate(prof, nil, "", 1); err == nil || !strings.Contains(err.Error(), "need local workers") {
		t.Errorf("no workers: %v", err)
	}
}
