// The routing side of a node: pings, refreshes, iterative lookups and the
// routing table.

package dht

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	kb "github.com/libp2p/go-libp2p-kbucket"
	"github.com/libp2p/go-libp2p/core/peer"
	ma "github.com/multiformats/go-multiaddr"

	"github.com/skyhive/skyhive/p2p"
)

// Ping checks that p serves the DHT and adds it to the routing table.
func (n *Node) Ping(ctx context.Context, p peer.AddrInfo) error {
	req, err := n.request(&request{Type: msgPing})
	if err != nil {
		return err
	}
	_, err = n.call(ctx, p, req, msgPing)
	return err
}

// Refresh pings routing-table peers not heard from within RefreshInterval
// (evicting those that fail), then looks up the node's own ID and a random
// key in each bucket up to the deepest one, which fills the table with
// near and far peers alike.
func (n *Node) Refresh(ctx context.Context) error {
	if n.cfg.RefreshInterval > 0 {
		n.pingStale(ctx, n.clk.Now().Add(-n.cfg.RefreshInterval))
	}
	self := kb.ConvertPeerID(n.self)
	if _, err := n.closest(ctx, self); err != nil && !errors.Is(err, ErrNoPeers) {
		return err
	}
	for cpl := range n.rt.GetTrackedCplsForRefresh() {
		key, err := n.rt.GenRandomKey(uint(cpl))
		if err != nil {
			return fmt.Errorf("dht: refresh key: %w", err)
		}
		if _, err := n.closest(ctx, key); err != nil && !errors.Is(err, ErrNoPeers) {
			return err
		}
	}
	return ctx.Err()
}

func (n *Node) pingStale(ctx context.Context, before time.Time) {
	var stale []peer.ID
	for _, pi := range n.rt.GetPeerInfos() {
		if pi.LastSuccessfulOutboundQueryAt.Before(before) {
			stale = append(stale, pi.Id)
		}
	}
	sem := make(chan struct{}, n.cfg.Alpha)
	var wg sync.WaitGroup
	for _, id := range stale {
		if ctx.Err() != nil {
			break
		}
		sem <- struct{}{}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			_ = n.Ping(ctx, n.addrInfo(id)) // failures evict the peer
		}()
	}
	wg.Wait()
}

// ClosestPeers finds the BucketSize peers nearest to key that answered.
func (n *Node) ClosestPeers(ctx context.Context, key string) ([]peer.AddrInfo, Stats, error) {
	req, err := n.request(&request{Type: msgFindNode, Target: kb.ConvertKey(key)})
	if err != nil {
		return nil, Stats{}, err
	}
	l, err := n.iterate(ctx, kb.ConvertKey(key), req, msgFindNode, nil)
	cs := l.closest(n.cfg.BucketSize)
	out := make([]peer.AddrInfo, len(cs))
	for i, c := range cs {
		out[i] = c.info
	}
	return out, l.stats(), err
}

// closest runs a FIND_NODE lookup and returns the Replicas nearest peers
// that answered.
func (n *Node) closest(ctx context.Context, target kb.ID) ([]*candidate, error) {
	req, err := n.request(&request{Type: msgFindNode, Target: target})
	if err != nil {
		return nil, err
	}
	l, err := n.iterate(ctx, target, req, msgFindNode, nil)
	return l.closest(n.cfg.Replicas), err
}

func (l *lookup) stats() Stats {
	st := Stats{Queries: l.queries}
	for _, c := range l.cands {
		switch c.state {
		case candFailed:
			st.Failures++
		case candDone:
			if st.Hops == 0 {
				st.Hops = c.hop
			}
		}
	}
	return st
}

// iterate runs an iterative lookup towards target, sending req to at most
// Alpha peers at a time. visit sees every answer and may end the lookup
// early by returning true. The returned lookup holds the peers that
// answered.
func (n *Node) iterate(ctx context.Context, target kb.ID, req []byte, want msgType, visit func(*candidate, *response) bool) (_ *lookup, err error) {
	l := newLookup(target, n.self, n.cfg.BucketSize, n.cfg.Alpha, n.cfg.MaxQueries)
	if n.m != nil {
		t0 := time.Now()
		defer func() {
			n.m.lookup(want, t0, l.queries, err)
			if want != msgFindValue {
				n.m.hop(want, l.stats().Hops)
			}
		}()
	}
	if n.isClosed() {
		return l, ErrClosed
	}
	for _, id := range n.rt.NearestPeers(target, n.cfg.BucketSize) {
		l.add(n.addrInfo(id), 1)
	}
	if len(l.cands) == 0 {
		return l, ErrNoPeers
	}
	lctx, cancel := context.WithCancel(ctx)
	defer cancel()
	type result struct {
		c    *candidate
		resp *response
		err  error
	}
	results := make(chan result, n.cfg.Alpha)
	inflight, stop := 0, false
	for {
		for !stop && ctx.Err() == nil {
			c, ok := l.next()
			if !ok {
				break
			}
			inflight++
			info := c.info
			go func() {
				resp, err := n.call(lctx, info, req, want)
				results <- result{c, resp, err}
			}()
		}
		if inflight == 0 {
			break
		}
		r := <-results
		inflight--
		if r.err != nil {
			l.fail(r.c.info.ID)
			continue
		}
		l.succeed(r.c.info.ID, r.resp.Peers)
		if visit != nil && !stop && visit(r.c, r.resp) {
			stop = true
			cancel()
		}
	}
	n.rt.ResetCplRefreshedAtForID(target, n.clk.Now())
	if err := ctx.Err(); err != nil {
		return l, fmt.Errorf("dht: lookup: %w", err)
	}
	return l, nil
}

// request encodes r with this node's header (client flag, addresses).
func (n *Node) request(r *request) ([]byte, error) {
	r.Client = n.cfg.ClientMode
	if !r.Client {
		r.Addrs = n.t.AddrInfo().Addrs
	}
	return encodeRequest(r)
}

// call sends one request and decodes the answer. A peer that fails to
// answer (not counting our own cancellation) or answers garbage is evicted
// from the routing table; a peer that answers is added to it.
func (n *Node) call(ctx context.Context, to peer.AddrInfo, req []byte, want msgType) (*response, error) {
	cctx, cancel := context.WithTimeout(ctx, n.cfg.RPCTimeout)
	defer cancel()
	raw, err := n.t.Call(cctx, to, ProtocolID, req)
	if err != nil {
		var re *p2p.RemoteError
		if !errors.As(err, &re) && ctx.Err() == nil {
			n.removePeer(to.ID)
		}
		return nil, fmt.Errorf("dht: %s to %s: %w", want, to.ID.ShortString(), err)
	}
	resp, err := decodeResponse(raw)
	if err == nil && resp.Type != want {
		err = fmt.Errorf("%w: answer %s to %s", errMalformed, resp.Type, want)
	}
	if err != nil {
		n.removePeer(to.ID)
		return nil, fmt.Errorf("dht: %s to %s: %w", want, to.ID.ShortString(), err)
	}
	n.addPeer(to, true)
	return resp, nil
}

// addPeer offers p to the routing table, remembering its addresses if it
// is (or already was) in the table.
func (n *Node) addPeer(p peer.AddrInfo, answered bool) {
	n.addPeerSeen(p, answered, n.observedAddrs(p.ID))
}

// addPeerSeen is addPeer with the addresses the transport sees p at.
// Peers are not replaceable: a full bucket keeps its long-lived members
// until they fail to answer, and newcomers wait. A newcomer is refused if
// its bucket already holds MaxPeersPerIP peers at its IP address or
// MaxPeersPerSubnet in its subnet.
func (n *Node) addPeerSeen(p peer.AddrInfo, answered bool, observed []ma.Multiaddr) {
	if p.ID == "" || p.ID == n.self {
		return
	}
	g := n.group(observed, p.Addrs)
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.closed {
		return
	}
	known := n.rt.Find(p.ID) != ""
	if !known && g.limited && !n.diverse(p.ID, g) {
		return
	}
	added, err := n.rt.TryAddPeer(p.ID, answered, false)
	if err != nil {
		return
	}
	if len(p.Addrs) > 0 {
		n.addrs[p.ID] = p.Addrs
	}
	if added || !known {
		n.groups[p.ID] = g
	}
	// The table stamps a new peer with the wall clock; restamp it with the
	// node's clock, which Refresh compares against.
	if answered || added {
		n.rt.UpdateLastSuccessfulOutboundQueryAt(p.ID, n.clk.Now())
	}
}

// diverse reports whether id, at address group g, may join its bucket.
// Called with n.mu held.
func (n *Node) diverse(id peer.ID, g addrGroup) bool {
	self := kb.ConvertPeerID(n.self)
	cpl := kb.CommonPrefixLen(kb.ConvertPeerID(id), self)
	sameIP, sameNet := 0, 0
	for _, other := range n.rt.ListPeers() {
		og, ok := n.groups[other]
		if !ok || !og.limited || kb.CommonPrefixLen(kb.ConvertPeerID(other), self) != cpl {
			continue
		}
		if og.ip == g.ip {
			sameIP++
		}
		if og.subnet == g.subnet {
			sameNet++
		}
	}
	ipOK := n.cfg.MaxPeersPerIP < 0 || sameIP < n.cfg.MaxPeersPerIP
	netOK := n.cfg.MaxPeersPerSubnet < 0 || sameNet < n.cfg.MaxPeersPerSubnet
	return ipOK && netOK
}

func (n *Node) removePeer(id peer.ID) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.rt.RemovePeer(id)
	delete(n.addrs, id)
	delete(n.groups, id)
}

func (n *Node) addrInfo(id peer.ID) peer.AddrInfo {
	n.mu.Lock()
	defer n.mu.Unlock()
	return peer.AddrInfo{ID: id, Addrs: n.addrs[id]}
}

// nearestInfos returns up to BucketSize routing-table peers nearest to
// target, without exclude.
func (n *Node) nearestInfos(target kb.ID, exclude peer.ID) []peer.AddrInfo {
	ids := n.rt.NearestPeers(target, n.cfg.BucketSize+1)
	out := make([]peer.AddrInfo, 0, len(ids))
	n.mu.Lock()
	defer n.mu.Unlock()
	for _, id := range ids {
		if id == exclude || len(out) == n.cfg.BucketSize {
			continue
		}
		out = append(out, peer.AddrInfo{ID: id, Addrs: n.addrs[id]})
	}
	return out
}
