// WAGMA with ranks: butterfly groups activated by the first peer to arrive,
// and the global average every Tau rounds.

package optimizer

import (
	"context"

	"github.com/skyhive/skyhive/averaging"
)

// wagma is wait-avoiding group model averaging over a fixed roster
// (WAGMA with averaging.MatchRanks): after every step this peer joins (or
// activates) its butterfly group of the round in the background and the
// group's average is applied at a later Step; every Tau rounds, or when
// another peer announced a global round, the models are averaged with
// every live peer synchronously.
type wagma struct {
	stateless
	o   *Optimizer
	tau int
}

// newWAGMA returns WAGMA over the fixed roster, or over groups formed
// through the DHT with averaging.MatchDHT (match.go).
func newWAGMA(o *Optimizer) (algorithm, error) {
	if o.ranks == nil {
		return &matched{o: o}, nil
	}
	return &wagma{o: o, tau: o.cfg.Tau}, nil
}

func (w *wagma) step(ctx context.Context, samples, round int) error {
	o, r := w.o, w.o.ranks
	round++
	o.innerStep(samples, round)
	target := -1
	if k := int(r.global.Load()); k > r.lastGlobal && k >= round {
		target = k // another peer started a global round: join it now
	} else if round%w.tau == 0 {
		target = round
	}
	if target < 0 {
		r.startGroup(round, true)
		return nil
	}
	r.activateAll(ctx, target)
	if err := o.averageModels(ctx, target); err != nil {
		return err
	}
	r.lastGlobal = target
	return nil
}

func (w *wagma) busyLocked() bool { return false }

// groupWorkLocked averages the model after the last Step with the group
// (Optimizer.averageInto).
func (w *wagma) groupWorkLocked() func(context.Context, averaging.Session) {
	o := w.o
	snap, r0, syncs := o.snapshotLocked(), o.round, o.syncs
	return func(ctx context.Context, s averaging.Session) { o.averageInto(ctx, s, snap, r0, syncs) }
}

// joinGlobal leaves global rounds to the next Step, which joins them.
func (w *wagma) joinGlobal(int) bool { return false }
