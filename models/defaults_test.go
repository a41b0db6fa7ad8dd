package models

import "testing"

// Every language model carries its training defaults in the registry; the
// image classifiers take the commands' own.
func TestDefaultsOf(t *testing.T) {
	for _, m := range List() {
		d := DefaultsOf(m.Name)
		if d != m.Defaults {
			t.Errorf("%s: DefaultsOf %+v, entry %+v", m.Name, d, m.Defaults)
		}
		lm := m.Task == LanguageModeling
		if set := d.Batch > 0 && d.LR > 0 && d.Warmup > 0 && d.ClipNorm > 0; set != lm {
			t.Errorf("%s (%v): defaults %+v", m.Name, m.Task, d)
		}
	}
	gpt, mlm := DefaultsOf("gpt-mini:1024x64"), DefaultsOf("bert-mlm-mini")
	if gpt != DefaultsOf("gpt-mini") || gpt != DefaultsOf("gpt:2x64:500") || gpt.LR != 3e-3 || gpt.Batch != 16 {
		t.Errorf("GPT defaults %+v", gpt)
	}
	if !(mlm.LR > 0 && mlm.LR < gpt.LR) {
		t.Errorf("a masked language model's learning rate %v, want below GPT's %v", mlm.LR, gpt.LR)
	}
	if d := DefaultsOf("no-such-model"); d != (TrainDefaults{}) {
		t.Errorf("unknown model: %+v", d)
	}
}

// ApplyDefaults replaces the options not given by the model's defaults and
// keeps those given, and every option of a model without defaults.
func TestApplyDefaults(t *testing.T) {
	values := TrainDefaults{Batch: 32, LR: 0.05, Warmup: 7, ClipNorm: 2}
	given := func(option string) bool { return option == "lr" || option == "clip" }
	got := ApplyDefaults("gpt-mini", given, values)
	gpt := DefaultsOf("gpt-mini")
	if want := (TrainDefaults{Batch: gpt.Batch, LR: 0.05, Warmup: gpt.Warmup, ClipNorm: 2}); got != want {
		t.Errorf("gpt-mini: got %+v, want %+v", got, want)
	}
	if got := ApplyDefaults("mlp-small", func(string) bool { return false }, values); got != values {
		t.Errorf("mlp-small: got %+v, want %+v", got, values)
	}
}
