// WAGMA with DHT matchmaking: a group formed through the DHT every round.

package optimizer

import (
	"context"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/skyhive/skyhive/averaging"
	"github.com/skyhive/skyhive/clock"
)

// GroupInfo describes one MatchDHT group all-reduce this peer took part in.
type GroupInfo struct {
	Round   int // the wall-clock matchmaking round
	Key     string
	Members []peer.ID
	Result  averaging.Result
	Err     error
	// Mismatched lists peers of the run whose model signature differs.
	Mismatched []averaging.PeerInfo
}

// matched is WAGMA with averaging.MatchDHT: no ranks and no global
// rounds; every wall-clock round a group is formed through the DHT and
// averaged with in the background (matchLoop), and Step only steps.
type matched struct {
	stateless
	o *Optimizer
}

func (m *matched) step(_ context.Context, samples, round int) error {
	m.o.innerStep(samples, round+1)
	return nil
}

// startLocked starts the matchmaking loop.
func (m *matched) startLocked(ctx context.Context) {
	m.o.goLocked(func() { m.matchLoop(ctx) })
}

// matchLoop runs MatchDHT: at every round boundary it forms a group
// through the DHT, averages the current model with it and leaves the
// result as a correction for the next Step, as a WAGMA group round does.
// Rounds are skipped while one is still running.
func (m *matched) matchLoop(ctx context.Context) {
	o, mm := m.o, m.o.mm
	for ctx.Err() == nil {
		r := mm.RoundAt(time.Now()) + 1
		if err := clock.SleepUntil(ctx, mm.Start(r)); err != nil {
			return
		}
		o.mu.Lock()
		stepRound := o.round
		o.mu.Unlock()
		// Cancel a round that overruns into the next one's window.
		rctx, cancel := context.WithDeadline(ctx, mm.Start(r+2))
		info := m.matchRound(rctx, r, stepRound)
		cancel()
		if ctx.Err() != nil {
			return
		}
		// List this peer for late joiners (off the round's critical path).
		actx, cancel := context.WithTimeout(ctx, mm.Interval())
		err := mm.Announce(actx, stepRound)
		cancel()
		o.mu.Lock()
		switch {
		case info.Err != nil && info.Members == nil, err != nil:
			o.stats.MatchErrors++
		case len(info.Members) < 2:
			o.stats.Alone++
		default:
			o.stats.Groups++
			o.stats.GroupMembers += len(info.Members)
		}
		o.stats.Mismatched += len(info.Mismatched)
		o.mu.Unlock()
		if o.onGroup != nil && (len(info.Members) > 0 || len(info.Mismatched) > 0) {
			o.onGroup(info)
		}
	}
}

// matchRound forms the group of round r and averages with it.
func (m *matched) matchRound(ctx context.Context, r, stepRound int) GroupInfo {
	o := m.o
	info := GroupInfo{Round: r}
	f, err := o.mm.Form(ctx, r, stepRound)
	info.Key, info.Mismatched = f.Key, f.Mismatched
	if err != nil {
		info.Err = err
		return info
	}
	for _, m := range f.Session.Members {
		info.Members = append(info.Members, m.Peer.ID)
	}
	if len(f.Session.Members) < 2 {
		return info
	}
	o.mu.Lock()
	snap, r0, syncs := o.snapshotLocked(), o.round, o.syncs
	o.mu.Unlock()
	info.Result, info.Err = o.averageInto(ctx, f.Session, snap, r0, syncs)
	return info
}
