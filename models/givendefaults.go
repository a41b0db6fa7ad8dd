package models

// ApplyDefaults returns d, a command's training options, with each of
// Batch, LR, Warmup and ClipNorm replaced by the model's registry default
// (DefaultsOf) where the model has one and the option was not given: given
// reports whether the user gave an option, by name ("batch", "lr",
// "warmup", "clip").
func ApplyDefaults(model string, given func(string) bool, d TrainDefaults) TrainDefaults {
	m := DefaultsOf(model)
	if m.Batch > 0 && !given("batch") {
		d.Batch = m.Batch
	}
	if m.LR > 0 && !given("lr") {
		d.LR = m.LR
	}
	if m.Warmup > 0 && !given("warmup") {
		d.Warmup = m.Warmup
	}
	if m.ClipNorm > 0 && !given("clip") {
		d.ClipNorm = m.ClipNorm
	}
	return d
}
