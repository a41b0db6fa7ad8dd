// Package blocklist refuses misbehaving peers for a while. A List is
// wired into a libp2p host when it is built: as its connection gater (no
// dials to a blocked peer), around its resource manager (a blocked peer's
// streams are refused as they open) and around its security transports
// (a blocked peer's connections are not read); p2p.Host builds one and
// exposes it as Host.BlockList. Protocols call Block for what no honest
// peer sends.
package blocklist

import (
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
)

// maxBlocked bounds the peers blocked at once; when it is reached the
// block that ends soonest is dropped.
const maxBlocked = 4096

// Refusal is what a blocked peer is told.
const Refusal = "blocked: this peer sent what no honest peer sends (non-finite or absurd values); it is refused for a while"

// grace is how long after a block begins the peer's open streams are
// reset.
const grace = time.Second

// entry is one blocked peer.
type entry struct {
	until time.Time
	// told is set once a refused stream carried the reason; later
	// streams are reset as they open (see ResourceManager).
	told bool
}

// Options are a List's hooks into its host.
type Options struct {
	// Warn logs a warning a remote peer provoked (a block); the host
	// passes its rate-limited logger. Nil discards it.
	Warn func(msg string, args ...any)
}

// List is the set of blocked peers of one host. Its methods are safe for
// concurrent use.
type List struct {
	self peer.ID
	warn func(msg string, args ...any)
	// net is the host's network, for resetting a blocked peer's streams;
	// set by Attach before the first Block.
	net network.Network

	mu      sync.Mutex
	blocked map[peer.ID]*entry
	// any is set by the first Block: until then no connection looks a
	// peer up in blocked.
	any atomic.Bool
}

// New returns an empty List of the host whose peer ID is self.
func New(self peer.ID, opts Options) *List {
	if opts.Warn == nil {
		opts.Warn = slog.New(slog.DiscardHandler).Warn
	}
	return &List{self: self, warn: opts.Warn, blocked: map[peer.ID]*entry{}}
}

// Attach gives the list the host's network once the host runs, so that
// Block can reset a blocked peer's open streams. Call it before Block.
func (l *List) Attach(n network.Network) { l.net = n }

// Block refuses peer p for d. Nothing more is read from its TCP
// connections (see Stalling): its bytes wait in its own socket buffers and
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
func (l *List) Block(p peer.ID, d time.Duration) {
	if p == "" || p == l.self || d <= 0 {
		return
	}
	until := time.Now().Add(d)
	l.any.Store(true)
	l.mu.Lock()
	if len(l.blocked) >= maxBlocked {
		l.pruneLocked()
	}
	b := l.blocked[p]
	if b == nil {
		l.blocked[p] = &entry{until: until}
		// Streams of p that were open when the block began wait for
		// bytes that no longer come (and hold what their handlers
		// reserved): reset them, after the grace that lets the handler
		// that called Block answer why.
		time.AfterFunc(grace, func() { l.resetStreams(p) })
	} else if until.After(b.until) {
		b.until = until
	}
	l.mu.Unlock()
	l.warn("p2p: blocking a peer", "peer", p, "for", d)
}

// resetStreams resets every stream of p's connections, if p is still
// blocked.
func (l *List) resetStreams(p peer.ID) {
	if l.net == nil || !l.Blocked(p) {
		return
	}
	for _, c := range l.net.ConnsToPeer(p) {
		for _, s := range c.GetStreams() {
			_ = s.Reset()
		}
	}
}

// Refuse reports whether p is blocked now and, if so, notes that p was
// told why (Refusal): its later streams are reset as they open.
func (l *List) Refuse(p peer.ID) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if b := l.blockLocked(p); b != nil {
		b.told = true
		return true
	}
	return false
}

// Blocked reports whether p is blocked now.
func (l *List) Blocked(p peer.ID) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.blockLocked(p) != nil
}

// blockedFast is Blocked, without a lookup until the first Block.
func (l *List) blockedFast(p peer.ID) bool {
	return l.any.Load() && l.Blocked(p)
}

// blockedAndTold reports whether p is blocked now and was told why.
func (l *List) blockedAndTold(p peer.ID) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	b := l.blockLocked(p)
	return b != nil && b.told
}

// blockLocked returns p's block if it is in force, dropping an ended one.
func (l *List) blockLocked(p peer.ID) *entry {
	b := l.blocked[p]
	if b != nil && !time.Now().Before(b.until) {
		delete(l.blocked, p)
		return nil
	}
	return b
}

// pruneLocked drops ended blocks and, if the table is still full, the
// one that ends soonest.
func (l *List) pruneLocked() {
	now := time.Now()
	var first peer.ID
	var firstUntil time.Time
	for p, b := range l.blocked {
		if !now.Before(b.until) {
			delete(l.blocked, p)
			continue
		}
		if first == "" || b.until.Before(firstUntil) {
			first, firstUntil = p, b.until
		}
	}
	if len(l.blocked) >= maxBlocked {
		delete(l.blocked, first)
	}
}
