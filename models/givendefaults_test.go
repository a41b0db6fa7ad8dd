package models

import "testing"

// ApplyDefaults replaces the options not given by the model's registry
// defaults and keeps the given ones and those of a model without defaults.
func TestApplyDefaultsToOptionsNotGiven(t *testing.T) {
	cmd := TrainDefaults{Batch: 128, LR: 1e-3, Warmup: 200, ClipNorm: 5}
	gpt := DefaultsOf("gpt-mini")
	if got := ApplyDefaults("gpt-mini", func(string) bool { return false }, cmd); got != gpt {
		t.Errorf("nothing given: %+v, want the model's %+v", got, gpt)
	}
	given := func(name string) bool { return name == "lr" || name == "clip" }
	want := TrainDefaults{Batch: gpt.Batch, LR: cmd.LR, Warmup: gpt.Warmup, ClipNorm: cmd.ClipNorm}
	if got := ApplyDefaults("gpt-mini", given, cmd); got != want {
		t.Errorf("lr and clip given: %+v, want %+v", got, want)
	}
	if got := ApplyDefaults("mlp", func(string) bool { return false }, cmd); got != cmd {
		t.Errorf("mlp: %+v, want the command's %+v", got, cmd)
	}
}
