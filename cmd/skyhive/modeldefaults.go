package main

import (
	"github.com/spf13/pflag"

	"github.com/skyhive/skyhive/models"
)

// withModelDefaults returns flags, the values of the shared training flags
// (--batch, --lr, --warmup, --clip), with each replaced by the model's
// registry default (models.ApplyDefaults) where the flag was not given.
func withModelDefaults(fl *pflag.FlagSet, model string, flags models.TrainDefaults) models.TrainDefaults {
	return models.ApplyDefaults(model, fl.Changed, flags)
}
