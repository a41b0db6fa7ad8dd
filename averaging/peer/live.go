package peer

import (
	"context"
	"math"
	"sync"

	"github.com/skyhive/skyhive/averaging/optimizer"
	"github.com/skyhive/skyhive/dht"
	"github.com/skyhive/skyhive/p2p"
)

// Live is a running peer's numbers, for Config.Status.
type Live struct {
	// Stats and Progress are the averaging optimizer's (zero until the
	// peer starts training).
	Stats    optimizer.Stats
	Progress optimizer.Progress
	// Loss is a moving average of the training loss (NaN before the
	// first step).
	Loss float64
	// Eval is the last evaluation (nil before the first).
	Eval *Eval
}

// StatusFunc is Config.Status: it runs while the peer is in the swarm
// (from joining the DHT until the peer leaves; ctx ends then) with the
// peer's host and DHT node and a function that returns its numbers.
type StatusFunc func(ctx context.Context, h *p2p.Host, node *dht.Node, live func() Live)

// liveState is what Live reads: set by Run and the training loop, read by
// the status goroutine. A nil *liveState ignores updates.
type liveState struct {
	mu      sync.Mutex
	opt     *optimizer.Optimizer
	loss    float64
	hasLoss bool
	eval    *Eval
}

func (l *liveState) setOptimizer(o *optimizer.Optimizer) {
	if l != nil {
		l.mu.Lock()
		l.opt = o
		l.mu.Unlock()
	}
}

func (l *liveState) setLoss(v float64) {
	if l != nil {
		l.mu.Lock()
		l.loss, l.hasLoss = v, true
		l.mu.Unlock()
	}
}

func (l *liveState) setEval(e Eval) {
	if l != nil {
		l.mu.Lock()
		l.eval = &e
		l.mu.Unlock()
	}
}

func (l *liveState) get() Live {
	l.mu.Lock()
	opt, v := l.opt, Live{Loss: math.NaN(), Eval: l.eval}
	if l.hasLoss {
		v.Loss = l.loss
	}
	l.mu.Unlock()
	if opt != nil {
		v.Stats, v.Progress = opt.Stats(), opt.Progress()
	}
	return v
}

// startStatus runs cfg.Status, if set, until the returned stop is called.
func startStatus(ctx context.Context, cfg Config, h *p2p.Host, node *dht.Node, l *liveState) (stop func()) {
	if cfg.Status == nil {
		return func() {}
	}
	sctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		cfg.Status(sctx, h, node, l.get)
	}()
	return func() { cancel(); <-done }
}
