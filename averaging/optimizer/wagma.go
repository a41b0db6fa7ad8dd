// WAGMA with ranks: butterfly groups activated by the first peer to arrive,
// and the global average every Tau rounds.

package optimizer

import (
	"context"
	"errors"
	"fmt"
	"slices"
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
// already has; active says whether this peer is the activator. With
// WA-DiLoCo the group averages pseudo-gradients and takes an outer step
// (outerGroupLocked) instead of averaging models.
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
	busy := o.dl != nil && o.dl.queued > 0
	if !busy {
		select {
		case o.inflight <- struct{}{}:
		default:
			busy = true
		}
	}
	if busy {
		// Too busy: skip the round, and if another member activated it,
		// tell the group at once, so that it neither waits ReduceWait
		// for this peer nor takes it for dead.
		o.stats.GroupDeclined++
		if !active {
			o.joined[id] = round
			ctx, s := o.bgCtx, averaging.Session{ID: id, Members: ms}
			o.goLocked(func() { _ = o.avg.Decline(ctx, s, o.n) })
		}
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
	var average func(context.Context, averaging.Session)
	if o.dl != nil {
		average = o.outerGroupLocked()
	} else {
		snap, r0, syncs := o.snapshotLocked(), o.round, o.syncs
		average = func(ctx context.Context, s averaging.Session) { o.averageInto(ctx, s, snap, r0, syncs) }
	}
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
		average(ctx, averaging.Session{ID: id, Members: ms})
	})
}

// ErrRefused is returned (remotely) for an activation from a peer outside
// the roster or for a round outside Config.RoundWindow.
var ErrRefused = errors.New("averaging: activation refused")

// handleActivate joins a group round or notes a global round announced by
// another peer. Only roster members are heard (the libp2p identity of the
// caller, not anything in the message), a group activation only from a
// member of this peer's group of that round, and only rounds within
// RoundWindow of this peer's counter (a global round must also be a
// multiple of Tau): a stranger, or a member naming round 2^31−1, cannot
// jump the swarm's counters or make it start sessions at will.
func (o *Optimizer) handleActivate(ctx context.Context, from peer.ID, req []byte) ([]byte, error) {
	a, err := unmarshalActivation(req)
	if err != nil {
		return nil, err
	}
	if o.mm != nil {
		return nil, errors.New("averaging: this peer matches groups through the DHT")
	}
	if err := o.admitActivation(from, a); err != nil {
		o.mu.Lock()
		o.stats.Refused++
		o.mu.Unlock()
		return nil, err
	}
	switch a.Kind {
	case activateGlobal:
		if o.dl != nil && o.dl.wa && o.cfg.Tau > 1 {
			o.startGlobal(int(a.Round), false) // WA-DiLoCo: in the background
			break
		}
		for {
			cur := o.global.Load()
			if int64(a.Round) <= cur || o.global.CompareAndSwap(cur, int64(a.Round)) {
				break
			}
		}
	case activateGroup:
		o.startGroup(int(a.Round), false)
	}
	return nil, nil
}

// admitActivation checks who sent an activation and the round it names.
func (o *Optimizer) admitActivation(from peer.ID, a activation) error {
	if from == o.avg.Transport().ID() || !slices.ContainsFunc(o.cfg.Roster, func(m averaging.Member) bool { return m.Peer.ID == from }) {
		return fmt.Errorf("%w: %s is not in the roster", ErrRefused, from.ShortString())
	}
	o.mu.Lock()
	cur := o.round
	o.mu.Unlock()
	r := int(a.Round) // at most MaxInt32 (unmarshalActivation)
	if r > cur+o.cfg.RoundWindow || r < cur-o.cfg.RoundWindow {
		return fmt.Errorf("%w: round %d is outside %d±%d", ErrRefused, r, cur, o.cfg.RoundWindow)
	}
	switch a.Kind {
	case activateGlobal:
		if r%o.cfg.Tau != 0 {
			return fmt.Errorf("%w: global round %d is not a multiple of τ=%d", ErrRefused, r, o.cfg.Tau)
		}
	case activateGroup:
		ranks, _, err := averaging.ButterflyGroup(o.cfg.Rank, len(o.cfg.Roster), o.cfg.GroupSize, r)
		if err != nil {
			return err
		}
		if !slices.ContainsFunc(ranks, func(k int) bool { return o.cfg.Roster[k].Peer.ID == from }) {
			return fmt.Errorf("%w: %s is not in our group of round %d", ErrRefused, from.ShortString(), r)
		}
	}
	return nil
}
