package dht

import (
	"bytes"
	"slices"

	kb "github.com/libp2p/go-libp2p-kbucket"
	"github.com/libp2p/go-libp2p/core/peer"
)

// lookup is the state of one iterative Kademlia lookup, without I/O: the
// caller asks next() for peers to query (at most alpha in flight), reports
// each answer with succeed or fail, and stops when done() is true. The
// lookup converges when the k closest peers that did not fail have all
// answered; a query budget bounds its cost on adversarial or churning
// networks.
type lookup struct {
	target     kb.ID
	self       peer.ID
	k, alpha   int
	maxQueries int
	maxCands   int

	cands    []*candidate // sorted by distance to target
	byID     map[peer.ID]*candidate
	inflight int
	queries  int
}

type candState uint8

const (
	candFresh candState = iota
	candWaiting
	candDone
	candFailed
)

type candidate struct {
	info  peer.AddrInfo
	dist  []byte
	hop   int // 1 for peers from our own table, else the hop of the peer that told us plus one
	state candState
}

func newLookup(target kb.ID, self peer.ID, k, alpha, maxQueries int) *lookup {
	return &lookup{
		target:     target,
		self:       self,
		k:          k,
		alpha:      alpha,
		maxQueries: maxQueries,
		maxCands:   4 * k,
		byID:       make(map[peer.ID]*candidate),
	}
}

// add offers a peer learned at the given hop. Unknown peers are inserted
// in distance order; known ones keep their state but gain addresses and the
// smaller hop.
func (l *lookup) add(info peer.AddrInfo, hop int) {
	if info.ID == "" || info.ID == l.self {
		return
	}
	if c := l.byID[info.ID]; c != nil {
		if len(c.info.Addrs) == 0 && len(info.Addrs) > 0 {
			c.info.Addrs = info.Addrs
		}
		c.hop = min(c.hop, hop)
		return
	}
	c := &candidate{info: info, dist: kb.Xor(l.target, kb.ConvertPeerID(info.ID)), hop: hop}
	i, _ := slices.BinarySearchFunc(l.cands, c.dist, func(a *candidate, d []byte) int { return bytes.Compare(a.dist, d) })
	if i >= l.maxCands {
		return // farther than everything we keep
	}
	l.cands = slices.Insert(l.cands, i, c)
	l.byID[info.ID] = c
	// Keep the list bounded: drop the farthest fresh candidates.
	for j := len(l.cands) - 1; len(l.cands) > l.maxCands && j >= 0; j-- {
		if l.cands[j].state == candFresh {
			delete(l.byID, l.cands[j].info.ID)
			l.cands = slices.Delete(l.cands, j, j+1)
		}
	}
}

// next returns the closest unqueried peer among the k closest live ones,
// marking it in flight, or false if none should be queried now.
func (l *lookup) next() (*candidate, bool) {
	if l.inflight >= l.alpha || l.queries >= l.maxQueries {
		return nil, false
	}
	seen := 0
	for _, c := range l.cands {
		if c.state == candFailed {
			continue
		}
		if seen++; seen > l.k {
			break
		}
		if c.state == candFresh {
			c.state = candWaiting
			l.inflight++
			l.queries++
			return c, true
		}
	}
	return nil, false
}

// succeed records p's answer and the closer peers it named.
func (l *lookup) succeed(p peer.ID, closer []peer.AddrInfo) {
	c := l.byID[p]
	if c == nil || c.state != candWaiting {
		return
	}
	c.state = candDone
	l.inflight--
	for _, info := range closer {
		l.add(info, c.hop+1)
	}
}

// fail records that p did not answer.
func (l *lookup) fail(p peer.ID) {
	c := l.byID[p]
	if c == nil || c.state != candWaiting {
		return
	}
	c.state = candFailed
	l.inflight--
}

// done reports whether nothing is in flight and nothing more is worth asking.
func (l *lookup) done() bool {
	if l.inflight > 0 {
		return false
	}
	if l.queries >= l.maxQueries {
		return true
	}
	seen := 0
	for _, c := range l.cands {
		if c.state == candFailed {
			continue
		}
		if seen++; seen > l.k {
			break
		}
		if c.state == candFresh {
			return false
		}
	}
	return true
}

// closest returns up to n peers that answered, closest first.
func (l *lookup) closest(n int) []*candidate {
	var out []*candidate
	for _, c := range l.cands {
		if len(out) == n {
			break
		}
		if c.state == candDone {
			out = append(out, c)
		}
	}
	return out
}
