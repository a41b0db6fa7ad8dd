package hostile

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/core/protocol"

	"github.com/skyhive/skyhive/averaging"
	"github.com/skyhive/skyhive/averaging/optimizer"
	"github.com/skyhive/skyhive/clock"
	"github.com/skyhive/skyhive/dht"
	"github.com/skyhive/skyhive/p2p"
)

// RosterSquat is a stranger that joins the fixed roster (rank
// matchmaking) of a run of an open swarm: it lists itself under the run
// with the model signature it copies from the run's own listings, answers
// each peer's roster question (averaging.RosterProtocol) with the roster
// that peer proposes plus itself, says it is ready, and then takes the
// contributions, activations and state requests the peers send it without
// ever answering. The run's peers must go on training: they cannot tell it
// from a slow peer before their first all-reduces, so they take it in and
// then drop it as a member that missed them.
type RosterSquat struct {
	// Host is the squatter's identity (required); it must be reachable
	// by the run's peers.
	Host *p2p.Host
	// DHT are the swarm's DHT nodes to join through (required).
	DHT []peer.AddrInfo
	// RunID is the run to squat (required).
	RunID string
	// Silent only lists itself under the run: it answers no roster
	// question (it copies the listing, not the peer).
	Silent bool
}

// SquatTally is what a RosterSquat did.
type SquatTally struct {
	// Signature is the model signature copied from the run's listings.
	Signature string `json:"signature"`
	// Questions counts the roster questions it answered as a member.
	Questions int64 `json:"questions"`
	// Held counts the requests (contributions, activations, state
	// downloads) it took and never answered, HeldBytes their bytes.
	Held      int64 `json:"held"`
	HeldBytes int64 `json:"held_bytes"`
	// LastHeld is when the last of them came (zero if none): the run's
	// peers dropped the squatter about then.
	LastHeld time.Time `json:"last_held"`
}

// squatter is a running RosterSquat's state.
type squatter struct {
	s         RosterSquat
	questions atomic.Int64
	held      atomic.Int64
	heldBytes atomic.Int64
	lastHeld  atomic.Int64 // unix nanoseconds

	mu        sync.Mutex
	proposals map[peer.ID][]string // what each peer of the run proposes
}

// Run squats the run for d (or until ctx ends) and reports what it did.
// It fails if no peer of the run is listed within d.
func (s RosterSquat) Run(ctx context.Context, d time.Duration) (SquatTally, error) {
	if s.Host == nil || len(s.DHT) == 0 || s.RunID == "" {
		return SquatTally{}, errors.New("hostile: a roster squat needs a host, DHT nodes and a run ID")
	}
	ctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	dn, err := dht.New(s.Host, dht.Config{ClientMode: true})
	if err != nil {
		return SquatTally{}, err
	}
	defer dn.Close()
	if err := dn.Bootstrap(ctx, s.DHT); err != nil {
		return SquatTally{}, fmt.Errorf("hostile: join the DHT: %w", err)
	}
	sq := &squatter{s: s, proposals: map[peer.ID][]string{}}
	var tally SquatTally
	var listed []averaging.PeerInfo
	for tally.Signature == "" {
		listed, _ = averaging.FindPeers(ctx, dn, s.RunID)
		for _, p := range listed {
			if p.Addr.ID != s.Host.ID() && p.Model != "" {
				tally.Signature = p.Model
				break
			}
		}
		if tally.Signature != "" {
			break
		}
		if err := clock.Sleep(ctx, 200*time.Millisecond); err != nil {
			return tally, fmt.Errorf("hostile: no peer of run %q was listed: %w", s.RunID, err)
		}
	}
	h := s.Host
	if !s.Silent {
		h.SetHandler(averaging.RosterProtocol, sq.answerRoster)
	}
	for _, proto := range []protocol.ID{averaging.ReduceProtocol, optimizer.ActivateProtocol, optimizer.StateProtocol} {
		h.SetHandler(proto, sq.hold)
	}
	defer func() {
		for _, proto := range []protocol.ID{averaging.RosterProtocol, averaging.ReduceProtocol, optimizer.ActivateProtocol, optimizer.StateProtocol} {
			h.RemoveHandler(proto)
		}
	}()
	mm := averaging.NewMatchmaker(dn, h, averaging.MatchConfig{Run: s.RunID, Model: tally.Signature})
	for ctx.Err() == nil {
		_ = mm.Announce(ctx, 0)
		listed, _ = averaging.FindPeers(ctx, dn, s.RunID)
		sq.learnProposals(ctx, listed)
		_ = clock.Sleep(ctx, 300*time.Millisecond)
	}
	tally.Questions, tally.Held, tally.HeldBytes = sq.questions.Load(), sq.held.Load(), sq.heldBytes.Load()
	if t := sq.lastHeld.Load(); t != 0 {
		tally.LastHeld = time.Unix(0, t)
	}
	return tally, nil
}

// learnProposals asks the run's listed peers what roster they propose.
func (sq *squatter) learnProposals(ctx context.Context, listed []averaging.PeerInfo) {
	var wg sync.WaitGroup
	for _, p := range listed {
		if p.Addr.ID == sq.s.Host.ID() {
			continue
		}
		wg.Go(func() {
			cctx, cancel := context.WithTimeout(ctx, time.Second)
			defer cancel()
			b, err := sq.s.Host.Call(cctx, p.Addr, averaging.RosterProtocol, []byte(sq.s.RunID))
			var a rosterAnswer
			if err != nil || json.Unmarshal(b, &a) != nil {
				return
			}
			sq.mu.Lock()
			sq.proposals[p.Addr.ID] = a.Peers
			sq.mu.Unlock()
		})
	}
	wg.Wait()
}

// rosterAnswer mirrors the JSON answer of averaging.RosterProtocol.
type rosterAnswer struct {
	Run   string   `json:"run"`
	Peers []string `json:"peers"`
	Final bool     `json:"final"`
	Ready bool     `json:"ready"`
}

// answerRoster answers a peer of the run with the roster it proposes,
// this squatter added, and says it is ready.
func (sq *squatter) answerRoster(_ context.Context, from peer.ID, req []byte) ([]byte, error) {
	if string(req) != sq.s.RunID {
		return nil, errors.New("not a peer of that run")
	}
	sq.questions.Add(1)
	sq.mu.Lock()
	peers := slices.Clone(sq.proposals[from])
	sq.mu.Unlock()
	for _, id := range []peer.ID{from, sq.s.Host.ID()} {
		if !slices.Contains(peers, id.String()) {
			peers = append(peers, id.String())
		}
	}
	slices.Sort(peers)
	return json.Marshal(rosterAnswer{Run: sq.s.RunID, Peers: peers, Ready: true})
}

// hold takes a request and never answers it: the caller waits until its
// own timeout, or the handler's.
func (sq *squatter) hold(ctx context.Context, _ peer.ID, req []byte) ([]byte, error) {
	sq.held.Add(1)
	sq.heldBytes.Add(int64(len(req)))
	sq.lastHeld.Store(time.Now().UnixNano())
	<-ctx.Done()
	return nil, ctx.Err()
}
