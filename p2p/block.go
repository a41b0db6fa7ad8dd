package p2p

import (
	"time"

	"github.com/libp2p/go-libp2p/core/control"
	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
	ma "github.com/multiformats/go-multiaddr"
)

// maxBlocked bounds the peers blocked at once; when it is reached the
// block that ends soonest is dropped.
const maxBlocked = 4096

// Block refuses peer p for d: its streams are refused unread and new
// connections from or to it are refused. Its open connections are kept:
// closing them would make an attacker reconnect, and every refused
// connection costs the victim a full security handshake. Protocols call it
// for what no honest peer sends (non-finite or absurd values, say), so
// that a flood from one identity costs the victim one request, not all of
// them. A later Block extends an earlier one.
func (h *Host) Block(p peer.ID, d time.Duration) {
	if p == "" || p == h.ID() || d <= 0 {
		return
	}
	until := h.now().Add(d)
	h.mu.Lock()
	if h.blocked == nil {
		h.blocked = map[peer.ID]time.Time{}
	}
	if len(h.blocked) >= maxBlocked {
		h.pruneBlockedLocked()
	}
	if until.After(h.blocked[p]) {
		h.blocked[p] = until
	}
	h.mu.Unlock()
	h.warnPeer("p2p: blocking a peer", "peer", p, "for", d)
}

// errBlocked is what a blocked peer is told.
const errBlocked = "blocked: this peer sent what no honest peer sends (non-finite or absurd values); it is refused for a while"

// refusal says why a stream of p is refused.
func (h *Host) refusal(p peer.ID) string {
	if h.Blocked(p) {
		return errBlocked
	}
	return errClosedSwarm
}

// Blocked reports whether p is blocked now.
func (h *Host) Blocked(p peer.ID) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	until, ok := h.blocked[p]
	if ok && !h.now().Before(until) {
		delete(h.blocked, p)
		return false
	}
	return ok
}

// pruneBlockedLocked drops ended blocks and, if the table is still full,
// the one that ends soonest.
func (h *Host) pruneBlockedLocked() {
	now := h.now()
	var first peer.ID
	var firstUntil time.Time
	for p, until := range h.blocked {
		if !now.Before(until) {
			delete(h.blocked, p)
			continue
		}
		if first == "" || until.Before(firstUntil) {
			first, firstUntil = p, until
		}
	}
	if len(h.blocked) >= maxBlocked {
		delete(h.blocked, first)
	}
}

// gater refuses connections of blocked peers (h is set once the host
// exists).
type gater struct{ h *Host }

func (g *gater) blocked(p peer.ID) bool { return g.h != nil && g.h.Blocked(p) }

func (g *gater) InterceptPeerDial(p peer.ID) bool                 { return !g.blocked(p) }
func (g *gater) InterceptAddrDial(p peer.ID, _ ma.Multiaddr) bool { return !g.blocked(p) }
func (g *gater) InterceptAccept(network.ConnMultiaddrs) bool      { return true }
func (g *gater) InterceptSecured(_ network.Direction, p peer.ID, _ network.ConnMultiaddrs) bool {
	return !g.blocked(p)
}
func (g *gater) InterceptUpgraded(network.Conn) (bool, control.DisconnectReason) { return true, 0 }
