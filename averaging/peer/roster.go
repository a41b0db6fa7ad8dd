package peer

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	libp2ppeer "github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/core/protocol"

	"github.com/skyhive/skyhive/averaging"
	"github.com/skyhive/skyhive/clock"
	"github.com/skyhive/skyhive/dht"
	"github.com/skyhive/skyhive/p2p"
)

// RosterProtocol is averaging.RosterProtocol: answering it proves a peer
// alive before the barrier, so a stranger that copies the run's listing
// but does not run a peer of it is left out of the roster.
const RosterProtocol protocol.ID = averaging.RosterProtocol

// rosterSettlePolls is how many polls in a row (about a second apart) the
// live peers must stay the same, beyond the first, before a roster is
// agreed: peers of a run started a few seconds apart join one roster.
const rosterSettlePolls = 3

// rosterQuietPolls is how many polls a listing that did not answer is
// not asked again.
const rosterQuietPolls = 5

// rosterProbeTimeout bounds one question to a candidate.
const rosterProbeTimeout = 2 * time.Second

// maxRunIDBytes bounds a roster question (a run ID).
const maxRunIDBytes = 256

// rosterAnswer is what a peer answers on RosterProtocol (JSON).
type rosterAnswer struct {
	Run   string   `json:"run"`
	Peers []string `json:"peers"` // the roster it proposes, sorted peer IDs
	Final bool     `json:"final"` // the roster is agreed and will not change
	Ready bool     `json:"ready"` // it can take its first step
}

// rosterGate is what this peer answers on RosterProtocol, and the
// handler that answers it.
type rosterGate struct {
	h   *p2p.Host
	mu  sync.Mutex
	ans rosterAnswer
}

// openRosterGate starts answering roster questions for run on h.
func openRosterGate(h *p2p.Host, run string) *rosterGate {
	g := &rosterGate{h: h, ans: rosterAnswer{Run: run, Peers: []string{h.ID().String()}}}
	h.SetHandler(RosterProtocol, g.serve)
	return g
}

// close stops answering.
func (g *rosterGate) close() { g.h.RemoveHandler(RosterProtocol) }

func (g *rosterGate) serve(_ context.Context, _ libp2ppeer.ID, req []byte) ([]byte, error) {
	if len(req) > maxRunIDBytes {
		return nil, fmt.Errorf("a run ID has at most %d bytes", maxRunIDBytes)
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if string(req) != g.ans.Run {
		return nil, fmt.Errorf("not a peer of run %q", req)
	}
	return json.Marshal(g.ans)
}

func (g *rosterGate) propose(ids []libp2ppeer.ID, final bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.ans.Peers, g.ans.Final = idStrings(ids), final
}

func (g *rosterGate) setReady() {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.ans.Ready = true
}

// ask asks each of ps (at most 64 at a time) for its roster answer; those
// that do not answer as peers of run are left out of the map.
func ask(ctx context.Context, h *p2p.Host, run string, ps []libp2ppeer.AddrInfo) map[libp2ppeer.ID]rosterAnswer {
	var (
		mu  sync.Mutex
		out = map[libp2ppeer.ID]rosterAnswer{}
		wg  sync.WaitGroup
		sem = make(chan struct{}, 64)
	)
	for _, p := range ps {
		wg.Go(func() {
			sem <- struct{}{}
			defer func() { <-sem }()
			cctx, cancel := context.WithTimeout(ctx, rosterProbeTimeout)
			defer cancel()
			b, err := h.Call(cctx, p, RosterProtocol, []byte(run))
			if err != nil {
				return
			}
			var a rosterAnswer
			if json.Unmarshal(b, &a) != nil || a.Run != run || len(a.Peers) > averaging.MaxGroupSize {
				return
			}
			mu.Lock()
			out[p.ID] = a
			mu.Unlock()
		})
	}
	wg.Wait()
	return out
}

// rosterVerdict is what one poll of the roster's formation found.
type rosterVerdict struct {
	// Roster is the roster to take when Done.
	Roster []libp2ppeer.ID
	Done   bool
	// Excluded is set when the run's roster was agreed without this peer.
	Excluded bool
	// Odd is a live member that proposes another roster (for errors).
	Odd libp2ppeer.ID
}

// judgeRoster is one poll of a fixed roster's formation, a pure function
// of what this peer (self) sees: live are the peers of the run that
// answered (self included, sorted), answers what they answered, stable
// whether live has stayed what it is for rosterSettlePolls polls, and
// minPeers the smallest roster. The roster is agreed when it is stable,
// every live peer proposes it, and there are at least minPeers. A roster that other
// members agreed on (every member of it but self answers it as final) and
// that names self is taken: a peer that noticed a late candidate the
// others did not would otherwise wait on them for ever. A roster agreed
// without self excludes this peer.
func judgeRoster(self libp2ppeer.ID, live []libp2ppeer.ID, answers map[libp2ppeer.ID]rosterAnswer, stable bool, minPeers int) rosterVerdict {
	want := idStrings(live)
	agreed := true
	var odd libp2ppeer.ID
	for _, id := range live {
		if id == self {
			continue
		}
		if !slices.Equal(answers[id].Peers, want) {
			agreed = false
			if odd == "" {
				odd = id
			}
		}
	}
	if agreed && stable && len(live) >= minPeers {
		return rosterVerdict{Roster: live, Done: true}
	}
	for _, id := range live {
		a := answers[id]
		if id == self || !a.Final {
			continue
		}
		if !slices.Contains(a.Peers, self.String()) {
			return rosterVerdict{Excluded: true, Odd: id}
		}
		if r, ok := finalRoster(self, a.Peers, live, answers); ok && len(r) >= minPeers {
			return rosterVerdict{Roster: r, Done: true}
		}
	}
	return rosterVerdict{Odd: odd}
}

// finalRoster returns the roster names as peer IDs if every member of it
// but self is live and answered it as final.
func finalRoster(self libp2ppeer.ID, names []string, live []libp2ppeer.ID, answers map[libp2ppeer.ID]rosterAnswer) ([]libp2ppeer.ID, bool) {
	r := make([]libp2ppeer.ID, 0, len(names))
	for _, s := range names {
		id, err := libp2ppeer.Decode(s)
		if err != nil {
			return nil, false
		}
		if id != self {
			a, ok := answers[id]
			if !ok || !a.Final || !slices.Equal(a.Peers, names) || !slices.Contains(live, id) {
				return nil, false
			}
		}
		r = append(r, id)
	}
	return r, true
}

// formRoster agrees with the other peers of the run on the fixed roster
// (rank matchmaking): the peers listed in the DHT with this peer's model
// that answer on RosterProtocol, at least MinPeers of them, the same at
// every member. Peers listed later than the agreement are not members.
func formRoster(ctx context.Context, cfg Config, h *p2p.Host, g *rosterGate, mm *averaging.Matchmaker, node *dht.Node, sig string) ([]libp2ppeer.AddrInfo, error) {
	deadline := time.Now().Add(cfg.WaitPeers)
	self := h.ID()
	addrs := map[libp2ppeer.ID]libp2ppeer.AddrInfo{self: h.AddrInfo()}
	var last []libp2ppeer.ID
	same := 0 // polls in a row that found live unchanged
	// quiet holds listings that did not answer, with the poll before
	// which they are not asked again: a flood of listings that never
	// answer slows one poll, not every poll.
	quiet := map[libp2ppeer.ID]int{}
	notice := newWaitNotice(cfg.Log)
	for poll := 0; ; poll++ {
		infos := announceAndList(ctx, cfg, mm, node)
		var cands []libp2ppeer.AddrInfo
		for _, p := range infos {
			if p.Addr.ID != self && p.Model == sig && quiet[p.Addr.ID] <= poll && len(cands) < averaging.MaxGroupSize-1 {
				cands = append(cands, p.Addr)
			}
		}
		answers := ask(ctx, h, cfg.RunID, cands)
		for _, p := range cands {
			if _, ok := answers[p.ID]; !ok {
				quiet[p.ID] = poll + rosterQuietPolls
			}
		}
		live := []libp2ppeer.ID{self}
		for _, p := range cands {
			if _, ok := answers[p.ID]; ok {
				live = append(live, p.ID)
				addrs[p.ID] = p
			}
		}
		slices.Sort(live)
		g.propose(live, false)
		if slices.Equal(live, last) {
			same++
		} else {
			same = 0
		}
		v := judgeRoster(self, live, answers, same >= rosterSettlePolls, cfg.MinPeers)
		switch {
		case v.Excluded:
			return nil, fmt.Errorf("%w: the peers of run %q agreed on their roster without this peer (%s proposes one without it); rank matchmaking keeps the roster it starts with: start every peer within --wait-peers of each other, use a new run ID, or use --matchmaking dht, which takes peers at any time",
				ErrNoSwarm, cfg.RunID, v.Odd.ShortString())
		case v.Done:
			g.propose(v.Roster, true)
			out := make([]libp2ppeer.AddrInfo, len(v.Roster))
			for i, id := range v.Roster {
				out[i] = addrs[id]
			}
			if len(v.Roster) > cfg.MinPeers {
				logf(cfg.Log, "run %q: the roster has %d peers (at least %d wanted)", cfg.RunID, len(v.Roster), cfg.MinPeers)
			}
			return out, nil
		}
		last = live
		notice.update(cfg.RunID, len(live), cfg.MinPeers)
		if time.Now().After(deadline) {
			why := fmt.Sprintf("%d of %d peers of run %q answered within %v; check that every peer uses the same run ID, or lower the minimum of peers", len(live), cfg.MinPeers, cfg.RunID, cfg.WaitPeers)
			if len(live) >= cfg.MinPeers && v.Odd != "" {
				why = fmt.Sprintf("the %d peers of run %q that answered did not agree on the roster within %v (%s proposes another); a peer that answers some peers and not others delays it: close the swarm (--swarm-secret) or use a new run ID", len(live), cfg.RunID, cfg.WaitPeers, v.Odd.ShortString())
			}
			return nil, fmt.Errorf("%w: %s", ErrNoSwarm, why)
		}
		if err := clock.Sleep(ctx, min(cfg.RoundInterval, time.Second)); err != nil {
			return nil, err
		}
	}
}

// startBarrier makes the peers of a fixed roster take their first step
// together: each says it is ready (RosterProtocol) once it can step, and
// waits until every member is ready or has stopped answering (a member
// that died is dropped by the optimizer's first all-reduces). Rounds of a
// fixed roster are in lockstep, so a member that started later than an
// all-reduce's wait would stay a round behind the others and never
// average with them again.
func startBarrier(ctx context.Context, cfg Config, h *p2p.Host, g *rosterGate, roster []averaging.Member) error {
	g.setReady()
	deadline := time.Now().Add(cfg.WaitPeers)
	silent := map[libp2ppeer.ID]int{}
	var others []libp2ppeer.AddrInfo
	for _, m := range roster {
		if m.Peer.ID != h.ID() {
			others = append(others, m.Peer)
		}
	}
	for {
		answers := ask(ctx, h, cfg.RunID, others)
		ready, waiting := 1, []string(nil)
		for _, p := range others {
			a, ok := answers[p.ID]
			switch {
			case ok && a.Ready:
				ready++
				silent[p.ID] = 0
			case !ok && silent[p.ID] >= barrierSilentPolls:
				ready++ // dead: not waited for
			case !ok:
				silent[p.ID]++
				waiting = append(waiting, p.ID.ShortString())
			default:
				silent[p.ID] = 0
				waiting = append(waiting, p.ID.ShortString())
			}
		}
		if len(waiting) == 0 {
			return nil
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%w: %d of the %d peers of run %q were ready to step within %v (waiting for %s)", ErrNoSwarm, ready, len(roster), cfg.RunID, cfg.WaitPeers, strings.Join(waiting, ", "))
		}
		if err := clock.Sleep(ctx, 200*time.Millisecond); err != nil {
			return err
		}
	}
}

// barrierSilentPolls is how many barrier polls in a row a member may not
// answer before it is taken for dead and not waited for.
const barrierSilentPolls = 10

func idStrings(ids []libp2ppeer.ID) []string {
	s := make([]string, len(ids))
	for i, id := range ids {
		s[i] = id.String()
	}
	return s
}
