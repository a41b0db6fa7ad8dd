package p2p

import (
	"errors"
	"time"

	"github.com/libp2p/go-libp2p/core/control"
	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
	ma "github.com/multiformats/go-multiaddr"
)

// maxBlocked bounds the peers blocked at once; when it is reached the
// block that ends soonest is dropped.
const maxBlocked = 4096

// block is one blocked peer.
type block struct {
	until time.Time
	// told is set once a refused stream carried the reason; later
	// streams are reset as they open (see blockingRM).
	told bool
}

// Block refuses peer p for d. Nothing more is read from its TCP
// connections (see stalling): its bytes wait in its own socket buffers and
// TCP's flow control stops it sending, so a flood costs the victim neither
// decryption nor CPU. Over QUIC its first refused stream is told why and
// later ones are reset as they open, before protocol negotiation or any
// handler runs. This host does not dial it. Its connections are kept, and
// new ones are accepted and stalled: refusing them after the security
// handshake, as a connection gater can, made an attacker reconnect for
// every request and cost the victim a handshake each time. Protocols call
// Block for what no honest peer sends (non-finite or absurd values, say),
// so that a flood from one identity costs the victim one request, not all
// of them. A later Block extends an earlier one.
func (h *Host) Block(p peer.ID, d time.Duration) {
	if p == "" || p == h.ID() || d <= 0 {
		return
	}
	until := h.now().Add(d)
	h.anyBlocked.Store(true)
	h.mu.Lock()
	if h.blocked == nil {
		h.blocked = map[peer.ID]*block{}
	}
	if len(h.blocked) >= maxBlocked {
		h.pruneBlockedLocked()
	}
	b := h.blocked[p]
	if b == nil {
		h.blocked[p] = &block{until: until}
		// Streams of p that were open when the block began wait for
		// bytes that no longer come (and hold what their handlers
		// reserved): reset them, after the grace that lets the handler
		// that called Block answer why.
		time.AfterFunc(blockGrace, func() { h.resetStreams(p) })
	} else if until.After(b.until) {
		b.until = until
	}
	h.mu.Unlock()
	h.warnPeer("p2p: blocking a peer", "peer", p, "for", d)
}

// blockGrace is how long after a block begins the peer's open streams are
// reset.
const blockGrace = time.Second

// resetStreams resets every stream of p's connections, if p is still
// blocked.
func (h *Host) resetStreams(p peer.ID) {
	if !h.Blocked(p) {
		return
	}
	for _, c := range h.h.Network().ConnsToPeer(p) {
		for _, s := range c.GetStreams() {
			_ = s.Reset()
		}
	}
}

// errBlocked is what a blocked peer is told.
const errBlocked = "blocked: this peer sent what no honest peer sends (non-finite or absurd values); it is refused for a while"

// refusal says why a stream of p is refused; a blocked peer is told once.
func (h *Host) refusal(p peer.ID) string {
	h.mu.Lock()
	defer h.mu.Unlock()
	if b := h.blockLocked(p); b != nil {
		b.told = true
		return errBlocked
	}
	return errClosedSwarm
}

// Blocked reports whether p is blocked now.
func (h *Host) Blocked(p peer.ID) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.blockLocked(p) != nil
}

// blockedAndTold reports whether p is blocked now and was told why.
func (h *Host) blockedAndTold(p peer.ID) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	b := h.blockLocked(p)
	return b != nil && b.told
}

// blockLocked returns p's block if it is in force, dropping an ended one.
func (h *Host) blockLocked(p peer.ID) *block {
	b := h.blocked[p]
	if b != nil && !h.now().Before(b.until) {
		delete(h.blocked, p)
		return nil
	}
	return b
}

// pruneBlockedLocked drops ended blocks and, if the table is still full,
// the one that ends soonest.
func (h *Host) pruneBlockedLocked() {
	now := h.now()
	var first peer.ID
	var firstUntil time.Time
	for p, b := range h.blocked {
		if !now.Before(b.until) {
			delete(h.blocked, p)
			continue
		}
		if first == "" || b.until.Before(firstUntil) {
			first, firstUntil = p, b.until
		}
	}
	if len(h.blocked) >= maxBlocked {
		delete(h.blocked, first)
	}
}

// gater keeps this host from dialing blocked peers (h is set once the host
// exists). It accepts their connections, which stall (see Block).
type gater struct{ h *Host }

func (g *gater) blocked(p peer.ID) bool {
	return g.h != nil && g.h.anyBlocked.Load() && g.h.Blocked(p)
}

func (g *gater) InterceptPeerDial(p peer.ID) bool                 { return !g.blocked(p) }
func (g *gater) InterceptAddrDial(p peer.ID, _ ma.Multiaddr) bool { return !g.blocked(p) }
func (g *gater) InterceptAccept(network.ConnMultiaddrs) bool      { return true }
func (g *gater) InterceptSecured(network.Direction, peer.ID, network.ConnMultiaddrs) bool {
	return true
}
func (g *gater) InterceptUpgraded(network.Conn) (bool, control.DisconnectReason) { return true, 0 }

// errBlockedStream is the resource manager's refusal of a blocked peer's
// stream.
var errBlockedStream = errors.New("p2p: stream of a blocked peer")

// blockingRM is libp2p's resource manager, refusing the streams of a
// blocked peer: this host's own streams to it fail at once (their answers
// would never be read: a DHT lookup that asked it would wait out its
// timeout), and its streams, once it was told why, are reset as they open,
// before protocol negotiation, a handler goroutine or a reply.
type blockingRM struct {
	network.ResourceManager
	g *gater
}

// OpenStream refuses a blocked peer's streams, then defers to the resource
// manager.
func (r *blockingRM) OpenStream(p peer.ID, dir network.Direction) (network.StreamManagementScope, error) {
	// Until the first Block no stream looks a peer up (see gater.blocked).
	if h := r.g.h; h != nil && h.anyBlocked.Load() {
		if dir == network.DirOutbound && h.Blocked(p) || dir == network.DirInbound && h.blockedAndTold(p) {
			return nil, errBlockedStream
		}
	}
	return r.ResourceManager.OpenStream(p, dir)
}
