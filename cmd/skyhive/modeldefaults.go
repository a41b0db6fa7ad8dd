package main

import (
	"github.com/spf13/pflag"

	"github.com/skyhive/skyhive/models"
)

// withModelDefaults returns flags, the values of the shared training flags
// (--batch, --lr, --warmup, --clip), with each replaced by the model's
// registry default (models.DefaultsOf) where the model has one and the
// flag was not given.
func withModelDefaults(fl *pflag.FlagSet, model string, flags models.TrainDefaults) models.TrainDefaults {
	d, out := models.DefaultsOf(model), flags
	if d.Batch > 0 && !fl.Changed("batch") {
		out.Batch = d.Batch
	}
	if d.LR > 0 && !fl.Changed("lr") {
		out.LR = d.LR
	}
	if d.Warmup > 0 && !fl.Changed("warmup") {
		out.Warmup = d.Warmup
	}
	if d.ClipNorm > 0 && !fl.Changed("clip") {
		out.ClipNorm = d.ClipNorm
	}
	return out
}
