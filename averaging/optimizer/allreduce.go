package optimizer

import (
	"context"
	"fmt"

	"github.com/skyhive/skyhive/nn"
)

// allReduce is synchronous all-reduce SGD (AllReduce): every step the
// gradients are averaged with every live peer before the wrapped
// optimizer's step, and the models every Period steps so that replicas
// that took different steps when an all-reduce failed agree again; or,
// with Config.AverageModels, the models after every step.
type allReduce struct {
	stateless
	o      *Optimizer
	period int
	models bool // Config.AverageModels
}

func newAllReduce(o *Optimizer) (algorithm, error) {
	return &allReduce{o: o, period: o.cfg.Period, models: o.cfg.AverageModels}, nil
}

func (a *allReduce) step(ctx context.Context, samples, round int) error {
	o := a.o
	if !a.models {
		nn.FlatGrads(o.params, o.flat)
		if err := o.syncAverage(ctx, fmt.Sprintf("%s/grad/%d", o.cfg.RunID, round), o.flat); err != nil {
			return err
		}
		nn.SetFlatGrads(o.params, o.flat)
	}
	round++
	o.innerStep(samples, round)
	if a.models || round%a.period == 0 {
		return o.averageModels(ctx, round)
	}
	return nil
}
