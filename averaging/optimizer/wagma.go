// WAGMA with ranks: butterfly groups activated by the first peer to arrive,
// and the global average every Tau rounds.

package optimizer

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/skyhive/skyhive/averaging"
)

// alive returns the members at the given ranks that are not given up on.
func (o *Optimizer) alive(ranks []int) []averaging.Member {
	o.mu.Lock()
	defer o.mu.Unlock()
	var ms []averaging.Member
	for _, r := range ranks {
		m := o.cfg.Roster[r]
		if r == o.cfg.Rank || !o.dead[m.Peer.ID] {
			ms = append(ms, m)
		}
	}
	return ms
}

func (o *Optimizer) allRanks() []int {
	r := make([]int, len(o.cfg.Roster))
	for i := range r {
		r[i] = i
	}
	return r
}

// activateAll tells every live peer that global round k has started.
func (o *Optimizer) activateAll(ctx context.Context, k int) {
	o.activate(ctx, o.alive(o.allRanks()), activation{Kind: activateGlobal, Round: uint64(k)})
}

// activate sends the activation to every member but this peer and waits
// for the calls: activations are small, and waiting keeps goroutines
// bounded and makes sure the others learn of the round before we block in
// it. Failures are ignored (the all-reduce drops silent members).
func (o *Optimizer) activate(ctx context.Context, ms []averaging.Member, a activation) {
	msg := a.marshal()
	var wg sync.WaitGroup
	for _, m := range ms {
		if m.Peer.ID == o.avg.Transport().ID() {
			continue
		}
		wg.Go(func() {
			cctx, cancel := context.WithTimeout(ctx, o.avg.Config().ReduceWait)
			defer cancel()
			_, _ = o.avg.Transport().Call(cctx, m.Peer, ActivateProtocol, msg)
		})
	}
	wg.Wait()
}

// startGroup joins WAGMA's group round in the background unless this peer
// already has; active says whether this peer is the activator.
func (o *Optimizer) startGroup(round int, active bool) {
	ranks, index, err := averaging.ButterflyGroup(o.cfg.Rank, len(o.cfg.Roster), o.cfg.GroupSize, round)
	if err != nil {
		return
	}
	ms := o.alive(ranks)
	if len(ms) < 2 {
		return
	}
	id := fmt.Sprintf("%s/w/%d/%d", o.cfg.RunID, round, index)
	o.mu.Lock()
	defer o.mu.Unlock()
	if _, ok := o.joined[id]; ok || o.closed || !o.started {
		return
	}
	select {
	case o.inflight <- struct{}{}:
	default:
		o.stats.GroupDeclined++
		return
	}
	o.joined[id] = round
	for k, r := range o.joined { // forget rounds long past
		if r < round-64 {
			delete(o.joined, k)
		}
	}
	if active {
		o.stats.GroupActive++
	} else {
		o.stats.GroupPassive++
	}
	snap := o.snapshotLocked()
	ctx := o.bgCtx
	o.goLocked(func() {
		defer func() { <-o.inflight }()
		if active {
			// Activate the group while averaging: the members join on
			// receipt.
			done := make(chan struct{})
			go func() {
				defer close(done)
				o.activate(ctx, ms, activation{Kind: activateGroup, Round: uint64(round)})
			}()
			defer func() { <-done }()
		}
		o.averageInto(ctx, averaging.Session{ID: id, Members: ms}, snap)
	})
}

func (o *Optimizer) handleActivate(ctx context.Context, from peer.ID, req []byte) ([]byte, error) {
	a, err := unmarshalActivation(req)
	if err != nil {
		return nil, err
	}
	if o.mm != nil {
		return nil, errors.New("averaging: this peer matches groups through the DHT")
	}
	switch a.Kind {
	case activateGlobal:
		for {
			cur := o.global.Load()
			if int64(a.Round) <= cur || o.global.CompareAndSwap(cur, int64(a.Round)) {
				break
			}
		}
	case activateGroup:
		ranks, _, err := averaging.ButterflyGroup(o.cfg.Rank, len(o.cfg.Roster), o.cfg.GroupSize, int(a.Round))
		if err != nil {
			return nil, err
		}
		member := false
		for _, r := range ranks {
			member = member || o.cfg.Roster[r].Peer.ID == from
		}
		if !member {
			return nil, fmt.Errorf("averaging: %s is not in our group of round %d", from.ShortString(), a.Round)
		}
		o.startGroup(int(a.Round), false)
	}
	return nil, nil
}
