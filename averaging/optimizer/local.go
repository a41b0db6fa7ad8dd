package optimizer

import "context"

// localSGD is local SGD (Local): peers step alone and average their models
// with every live peer every Period steps.
type localSGD struct {
	stateless
	o      *Optimizer
	period int
}

func newLocalSGD(o *Optimizer) (algorithm, error) {
	return &localSGD{o: o, period: o.cfg.Period}, nil
}

func (l *localSGD) step(ctx context.Context, samples, round int) error {
	round++
	l.o.innerStep(samples, round)
	if round%l.period == 0 {
		return l.o.averageModels(ctx, round)
	}
	return nil
}
