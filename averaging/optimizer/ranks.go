// Matchmaking over a fixed roster (averaging.MatchRanks): the live
// members, WAGMA's butterfly group rounds activated by the first member to
// arrive, and global rounds announced to every peer.

package optimizer

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/skyhive/skyhive/averaging"
)

// ranks is an Optimizer's fixed roster and its rounds. The fields under
// Optimizer.mu are marked.
type ranks struct {
	o *Optimizer
	// groups is the algorithm that averages in butterfly groups; nil for
	// those that do not (all-reduce and local SGD, DiLoCo), which refuse
	// group activations.
	groups   grouper
	inflight chan struct{}
	global   atomic.Int64 // highest global round announced to us
	// lastGlobal is the last global round joined (Step's goroutine only).
	lastGlobal int

	// Under Optimizer.mu.
	joined map[string]int   // sessions joined, by round
	dead   map[peer.ID]bool // members dropped (see noteLocked)
	seen   map[peer.ID]bool // members that took part once
	misses map[peer.ID]int  // all-reduces missed in a row
}

func newRanks(o *Optimizer) *ranks {
	return &ranks{
		o: o, inflight: make(chan struct{}, o.cfg.MaxInflight), lastGlobal: -1,
		joined: map[string]int{}, dead: map[peer.ID]bool{}, seen: map[peer.ID]bool{}, misses: map[peer.ID]int{},
	}
}

// alive returns the members at the given ranks that are not given up on.
func (r *ranks) alive(ranks []int) []averaging.Member {
	o := r.o
	o.mu.Lock()
	defer o.mu.Unlock()
	var ms []averaging.Member
	for _, k := range ranks {
		m := o.cfg.Roster[k]
		if k == o.cfg.Rank || !r.dead[m.Peer.ID] {
			ms = append(ms, m)
		}
	}
	return ms
}

func (r *ranks) allRanks() []int {
	all := make([]int, len(r.o.cfg.Roster))
	for i := range all {
		all[i] = i
	}
	return all
}

// noteLocked gives up on members of a collective that failed or did not
// contribute and takes back those given up on that still call us; it
// returns how many it took back. Optimizer.mu must be held.
//
// A member that took part before and then missed is dead (killed,
// crashed, left). One that never took part may just be slow to start
// (loading data, a late joiner of a fixed roster): it is dropped only
// after neverSeenMisses all-reduces in a row without it, or everyone
// would train alone after a slow start.
func (r *ranks) noteLocked(members []averaging.Member, res averaging.Result, err error) (revived int) {
	bad := map[peer.ID]bool{}
	for _, id := range append(res.Failed, res.Missing...) {
		bad[id] = true
	}
	alive := map[peer.ID]bool{}
	for _, id := range res.Declined {
		alive[id] = true
	}
	for _, id := range res.Disagreed {
		alive[id] = true
		// A member given up on that still calls us is alive; taking it
		// back makes our member lists agree again, or the two sides of a
		// different view of who is dead would fail every collective.
		if r.dead[id] {
			delete(r.dead, id)
			revived++
		}
	}
	self := r.o.avg.Transport().ID()
	for _, m := range members {
		id := m.Peer.ID
		switch {
		case id == self:
		case alive[id]:
			// It declined (busy) or joined with another member list
			// (it gave up on someone we have not, or the other way
			// round): alive either way.
			delete(r.misses, id)
		case !bad[id]:
			if err == nil {
				r.seen[id] = true
			}
			delete(r.misses, id)
		default:
			r.misses[id]++
			if r.seen[id] || r.misses[id] >= neverSeenMisses {
				r.dead[id] = true
			}
		}
	}
	return revived
}

// neverSeenMisses is how many all-reduces in a row a member of a fixed
// roster that never took part may miss before it is dropped.
const neverSeenMisses = 5

// activateAll tells every live peer that global round k has started.
func (r *ranks) activateAll(ctx context.Context, k int) {
	r.activate(ctx, r.alive(r.allRanks()), activation{Kind: activateGlobal, Round: uint64(k)})
}

// activate sends the activation to every member but this peer and waits
// for the calls: activations are small, and waiting keeps goroutines
// bounded and makes sure the others learn of the round before we block in
// it. Failures are ignored (the all-reduce drops silent members).
func (r *ranks) activate(ctx context.Context, ms []averaging.Member, a activation) {
	msg := a.marshal()
	avg := r.o.avg
	var wg sync.WaitGroup
	for _, m := range ms {
		if m.Peer.ID == avg.Transport().ID() {
			continue
		}
		wg.Go(func() {
			cctx, cancel := context.WithTimeout(ctx, avg.Config().ReduceWait)
			defer cancel()
			_, _ = avg.Transport().Call(cctx, m.Peer, ActivateProtocol, msg)
		})
	}
	wg.Wait()
}

// startGroup joins the group round in the background unless this peer
// already has; active says whether this peer is the activator. The
// algorithm (groups) takes its part of the round and says what the group
// averages: models for WAGMA, pseudo-gradients for WA-DiLoCo.
func (r *ranks) startGroup(round int, active bool) {
	o := r.o
	members, index, err := averaging.ButterflyGroup(o.cfg.Rank, len(o.cfg.Roster), o.cfg.GroupSize, round)
	if err != nil {
		return
	}
	ms := r.alive(members)
	if len(ms) < 2 {
		return
	}
	id := fmt.Sprintf("%s/w/%d/%d", o.cfg.RunID, round, index)
	o.mu.Lock()
	defer o.mu.Unlock()
	if _, ok := r.joined[id]; ok || o.closed || !o.started {
		return
	}
	if !r.takeSlotLocked(id, round, ms, active) {
		return
	}
	average := r.groups.groupWorkLocked()
	ctx := o.bgCtx
	o.goLocked(func() {
		defer func() { <-r.inflight }()
		if active {
			// Activate the group while averaging: the members join on
			// receipt.
			done := make(chan struct{})
			go func() {
				defer close(done)
				r.activate(ctx, ms, activation{Kind: activateGroup, Round: uint64(round)})
			}()
			defer func() { <-done }()
		}
		average(ctx, averaging.Session{ID: id, Members: ms})
	})
}

// takeSlotLocked takes an in-flight slot for the group round of session id
// and notes the round joined, or, when this peer is too busy, skips the
// round and reports false: if another member activated it, the group is
// told at once, so that it neither waits ReduceWait for this peer nor
// takes it for dead. Optimizer.mu must be held.
func (r *ranks) takeSlotLocked(id string, round int, ms []averaging.Member, active bool) bool {
	o := r.o
	busy := r.groups.busyLocked()
	if !busy {
		select {
		case r.inflight <- struct{}{}:
		default:
			busy = true
		}
	}
	if busy {
		o.stats.GroupDeclined++
		if !active {
			r.joined[id] = round
			ctx, s := o.bgCtx, averaging.Session{ID: id, Members: ms}
			o.goLocked(func() { _ = o.avg.Decline(ctx, s, o.n) })
		}
		return false
	}
	r.joined[id] = round
	for k, at := range r.joined { // forget rounds long past
		if at < round-64 {
			delete(r.joined, k)
		}
	}
	if active {
		o.stats.GroupActive++
	} else {
		o.stats.GroupPassive++
	}
	return true
}

// ErrRefused is returned (remotely) for an activation from a peer outside
// the roster or for a round outside Config.RoundWindow.
var ErrRefused = errors.New("averaging: activation refused")

// handleActivate joins a group round or notes a global round announced by
// another peer (ActivateProtocol). Only roster members are heard (the
// libp2p identity of the caller, not anything in the message), a group
// activation only from a member of this peer's group of that round, and
// only rounds within RoundWindow of this peer's counter (a global round
// must also be a multiple of Tau): a stranger, or a member naming round
// 2^31−1, cannot jump the swarm's counters or make it start sessions at
// will.
func (o *Optimizer) handleActivate(ctx context.Context, from peer.ID, req []byte) ([]byte, error) {
	a, err := unmarshalActivation(req)
	if err != nil {
		return nil, err
	}
	if o.ranks == nil {
		return nil, errors.New("averaging: this peer matches groups through the DHT")
	}
	return nil, o.ranks.activated(from, a)
}

// activated handles an activation from another peer.
func (r *ranks) activated(from peer.ID, a activation) error {
	if err := r.admit(from, a); err != nil {
		r.o.mu.Lock()
		r.o.stats.Refused++
		r.o.mu.Unlock()
		return err
	}
	round := int(a.Round)
	switch a.Kind {
	case activateGlobal:
		if r.groups != nil && r.groups.joinGlobal(round) {
			break
		}
		for {
			cur := r.global.Load()
			if int64(round) <= cur || r.global.CompareAndSwap(cur, int64(round)) {
				break
			}
		}
	case activateGroup:
		if r.groups == nil {
			return fmt.Errorf("averaging: %s has no group rounds", r.o.cfg.Algo)
		}
		r.startGroup(round, false)
	}
	return nil
}

// admit checks who sent an activation and the round it names.
func (r *ranks) admit(from peer.ID, a activation) error {
	o := r.o
	if from == o.avg.Transport().ID() || !slices.ContainsFunc(o.cfg.Roster, func(m averaging.Member) bool { return m.Peer.ID == from }) {
		return fmt.Errorf("%w: %s is not in the roster", ErrRefused, from.ShortString())
	}
	o.mu.Lock()
	cur := o.round
	o.mu.Unlock()
	k := int(a.Round) // at most MaxInt32 (unmarshalActivation)
	if k > cur+o.cfg.RoundWindow || k < cur-o.cfg.RoundWindow {
		return fmt.Errorf("%w: round %d is outside %d±%d", ErrRefused, k, cur, o.cfg.RoundWindow)
	}
	switch a.Kind {
	case activateGlobal:
		if k%o.cfg.Tau != 0 {
			return fmt.Errorf("%w: global round %d is not a multiple of τ=%d", ErrRefused, k, o.cfg.Tau)
		}
	case activateGroup:
		members, _, err := averaging.ButterflyGroup(o.cfg.Rank, len(o.cfg.Roster), o.cfg.GroupSize, k)
		if err != nil {
			return err
		}
		if !slices.ContainsFunc(members, func(i int) bool { return o.cfg.Roster[i].Peer.ID == from }) {
			return fmt.Errorf("%w: %s is not in our group of round %d", ErrRefused, from.ShortString(), k)
		}
	}
	return nil
}
