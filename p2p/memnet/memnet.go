// Package memnet is an in-memory p2p.Transport for simulating large swarms
// (thousands of peers) inside one process.
//
// Every peer has a real libp2p identity (ed25519), so code that checks peer
// IDs or signatures behaves as it does over the network. A Call runs the
// target's handler in its own goroutine with a context derived from the
// caller's, returns when the handler answers or the caller's context ends,
// and never shares byte slices between caller and handler. An optional Link
// emulates delay, bandwidth, loss and partitions per message.
package memnet

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/libp2p/go-libp2p/core/crypto"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/core/protocol"
	ma "github.com/multiformats/go-multiaddr"

	"github.com/skyhive/skyhive/p2p"
)

// Errors returned by Call. They are wrapped; test with errors.Is.
var (
	// ErrUnknownPeer means the target was never on the network or has
	// been closed.
	ErrUnknownPeer = errors.New("memnet: unknown peer")
	// ErrUnreachable means the target (or the caller) is killed, or died
	// while the call was in flight.
	ErrUnreachable = errors.New("memnet: peer unreachable")
	// ErrClosed means the calling peer or the network is closed.
	ErrClosed = errors.New("memnet: closed")
	// ErrProtocolNotSupported means the target has no handler for the
	// protocol.
	ErrProtocolNotSupported = errors.New("memnet: protocol not supported")
	// ErrTooLarge means a request or response exceeds MaxMessageSize.
	ErrTooLarge = errors.New("memnet: message too large")
)

// MaxMessageSize bounds requests and responses, as a real transport would.
const MaxMessageSize = 16 << 20

// DefaultMaxInbound bounds the handlers running at once on one peer. Further
// calls wait (honouring their context) for a slot.
const DefaultMaxInbound = 64

// Link emulates the network between two peers. Deliver is called once per
// message (request from→to, then response to→from) with its size in bytes;
// it blocks for the emulated delay and serialization time and returns an
// error when the message is dropped or the peers are partitioned. It must
// return promptly when ctx ends.
type Link interface {
	Deliver(ctx context.Context, from, to peer.ID, size int) error
}

// Option configures a Network.
type Option func(*Network)

// WithLink sets the link emulation; nil delivers immediately.
func WithLink(l Link) Option { return func(n *Network) { n.link.Store(&linkBox{l}) } }

// WithBlackhole makes calls to killed peers hang until the caller's context
// ends, as with a crashed machine, instead of failing at once as with a
// refused connection.
func WithBlackhole() Option { return func(n *Network) { n.blackhole = true } }

// WithMaxInbound sets how many handlers may run at once on one peer.
func WithMaxInbound(k int) Option {
	return func(n *Network) {
		if k > 0 {
			n.maxInbound = k
		}
	}
}

type linkBox struct{ l Link }

// Network is a set of in-memory peers that can call each other.
type Network struct {
	link       atomic.Pointer[linkBox]
	blackhole  bool
	maxInbound int

	mu     sync.RWMutex
	peers  map[peer.ID]*Peer
	next   uint64
	closed bool
}

// NewNetwork returns an empty network.
func NewNetwork(opts ...Option) *Network {
	n := &Network{peers: make(map[peer.ID]*Peer), maxInbound: DefaultMaxInbound}
	for _, o := range opts {
		o(n)
	}
	return n
}

// SetLink replaces the link emulation; nil delivers immediately. Calls
// already in flight may still use the previous link.
func (n *Network) SetLink(l Link) { n.link.Store(&linkBox{l}) }

func (n *Network) currentLink() Link {
	if b := n.link.Load(); b != nil {
		return b.l
	}
	return nil
}

// NewPeer adds a peer with a fresh ed25519 identity.
func (n *Network) NewPeer() (*Peer, error) {
	priv, _, err := crypto.GenerateEd25519Key(rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("memnet: generate key: %w", err)
	}
	return n.AddPeer(priv)
}

// AddPeer adds a peer with the given identity.
func (n *Network) AddPeer(priv crypto.PrivKey) (*Peer, error) {
	id, err := peer.IDFromPrivateKey(priv)
	if err != nil {
		return nil, fmt.Errorf("memnet: peer id: %w", err)
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.closed {
		return nil, ErrClosed
	}
	if _, ok := n.peers[id]; ok {
		return nil, fmt.Errorf("memnet: peer %s already on the network", id.ShortString())
	}
	n.next++
	addr, err := ma.NewMultiaddr(fmt.Sprintf("/memory/%d", n.next))
	if err != nil {
		return nil, fmt.Errorf("memnet: address: %w", err)
	}
	p := &Peer{
		net:      n,
		id:       id,
		priv:     priv,
		addr:     addr,
		handlers: make(map[protocol.ID]p2p.Handler),
		inbound:  make(chan struct{}, n.maxInbound),
	}
	n.peers[id] = p
	return p, nil
}

// Kill makes a peer unreachable without warning: calls to and from it fail
// (or hang, with WithBlackhole), and calls in flight lose their response.
// Its handlers and state are kept for Revive.
func (n *Network) Kill(id peer.ID) error {
	p, err := n.lookup(id)
	if err != nil {
		return err
	}
	p.dead.Store(true)
	return nil
}

// Revive makes a killed peer reachable again.
func (n *Network) Revive(id peer.ID) error {
	p, err := n.lookup(id)
	if err != nil {
		return err
	}
	p.dead.Store(false)
	return nil
}

// Alive reports whether id is on the network and not killed.
func (n *Network) Alive(id peer.ID) bool {
	p, err := n.lookup(id)
	return err == nil && !p.dead.Load()
}

// Peers lists the peers on the network, killed ones included.
func (n *Network) Peers() []peer.ID {
	n.mu.RLock()
	defer n.mu.RUnlock()
	out := make([]peer.ID, 0, len(n.peers))
	for id := range n.peers {
		out = append(out, id)
	}
	return out
}

// Close closes every peer. Later calls fail with ErrClosed.
func (n *Network) Close() error {
	n.mu.Lock()
	n.closed = true
	peers := n.peers
	n.peers = make(map[peer.ID]*Peer)
	n.mu.Unlock()
	for _, p := range peers {
		p.closed.Store(true)
	}
	return nil
}

func (n *Network) lookup(id peer.ID) (*Peer, error) {
	n.mu.RLock()
	defer n.mu.RUnlock()
	if n.closed {
		return nil, ErrClosed
	}
	p, ok := n.peers[id]
	if !ok {
		return nil, fmt.Errorf("%w: %s", ErrUnknownPeer, id.ShortString())
	}
	return p, nil
}

// Peer is one simulated host. It implements p2p.Transport.
type Peer struct {
	net  *Network
	id   peer.ID
	priv crypto.PrivKey
	addr ma.Multiaddr

	dead   atomic.Bool
	closed atomic.Bool

	mu       sync.RWMutex
	handlers map[protocol.ID]p2p.Handler

	inbound chan struct{} // semaphore bounding running handlers
}

var _ p2p.Transport = (*Peer)(nil)

// ID is the peer's identity.
func (p *Peer) ID() peer.ID { return p.id }

// PrivKey is the peer's private key, for signing.
func (p *Peer) PrivKey() crypto.PrivKey { return p.priv }

// AddrInfo is the peer's identity with its /memory address.
func (p *Peer) AddrInfo() peer.AddrInfo {
	return peer.AddrInfo{ID: p.id, Addrs: []ma.Multiaddr{p.addr}}
}

// SetHandler registers h for proto, replacing any earlier handler; a nil h
// removes it.
func (p *Peer) SetHandler(proto protocol.ID, h p2p.Handler) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if h == nil {
		delete(p.handlers, proto)
		return
	}
	p.handlers[proto] = h
}

func (p *Peer) handler(proto protocol.ID) p2p.Handler {
	p.mu.RLock()
	defer p.mu.RUnlock()
	return p.handlers[proto]
}

// Close removes the peer from the network: it becomes unknown to others
// and its own calls fail with ErrClosed.
func (p *Peer) Close() error {
	if p.closed.Swap(true) {
		return nil
	}
	p.net.mu.Lock()
	if p.net.peers[p.id] == p {
		delete(p.net.peers, p.id)
	}
	p.net.mu.Unlock()
	return nil
}

func (p *Peer) usable() error {
	switch {
	case p.closed.Load():
		return ErrClosed
	case p.dead.Load():
		return fmt.Errorf("%w: caller %s is killed", ErrUnreachable, p.id.ShortString())
	}
	return nil
}

type reply struct {
	resp []byte
	err  error
}

// Call sends req to the peer to.ID over proto and waits for the response,
// honouring ctx. Errors from the remote handler come back as
// *p2p.RemoteError; transport failures wrap this package's errors.
func (p *Peer) Call(ctx context.Context, to peer.AddrInfo, proto protocol.ID, req []byte) ([]byte, error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("memnet: call %s: %w", to.ID.ShortString(), err)
	}
	if err := p.usable(); err != nil {
		return nil, err
	}
	if len(req) > MaxMessageSize {
		return nil, fmt.Errorf("%w: request of %d bytes", ErrTooLarge, len(req))
	}
	target, err := p.net.lookup(to.ID)
	if err != nil {
		return nil, err
	}
	if err := p.reachable(ctx, target); err != nil {
		return nil, err
	}
	link := p.net.currentLink()
	if link != nil {
		if err := link.Deliver(ctx, p.id, target.id, len(req)); err != nil {
			return nil, fmt.Errorf("memnet: deliver request to %s: %w", target.id.ShortString(), err)
		}
		if err := p.reachable(ctx, target); err != nil {
			return nil, err
		}
	}
	h := target.handler(proto)
	if h == nil {
		return nil, fmt.Errorf("%w: %s on %s", ErrProtocolNotSupported, proto, target.id.ShortString())
	}
	select {
	case target.inbound <- struct{}{}:
	case <-ctx.Done():
		return nil, fmt.Errorf("memnet: call %s: %w", target.id.ShortString(), ctx.Err())
	}
	hctx, cancel := context.WithCancel(ctx)
	defer cancel()
	done := make(chan reply, 1)
	in := append([]byte(nil), req...)
	go func() {
		defer func() { <-target.inbound }()
		resp, err := h(hctx, p.id, in)
		done <- reply{resp, err}
	}()
	var r reply
	select {
	case r = <-done:
	case <-ctx.Done():
		return nil, fmt.Errorf("memnet: call %s: %w", target.id.ShortString(), ctx.Err())
	}
	if err := p.reachable(ctx, target); err != nil {
		return nil, err
	}
	if r.err != nil {
		return nil, &p2p.RemoteError{Peer: target.id, Proto: proto, Msg: r.err.Error()}
	}
	if len(r.resp) > MaxMessageSize {
		return nil, fmt.Errorf("%w: response of %d bytes", ErrTooLarge, len(r.resp))
	}
	if link != nil {
		if err := link.Deliver(ctx, target.id, p.id, len(r.resp)); err != nil {
			return nil, fmt.Errorf("memnet: deliver response from %s: %w", target.id.ShortString(), err)
		}
		if err := p.reachable(ctx, target); err != nil {
			return nil, err
		}
	}
	return append([]byte(nil), r.resp...), nil
}

// reachable checks that both ends are up. With a blackhole network a dead
// target makes the call hang until ctx ends.
func (p *Peer) reachable(ctx context.Context, target *Peer) error {
	if err := p.usable(); err != nil {
		return err
	}
	if target.closed.Load() {
		return fmt.Errorf("%w: %s", ErrUnknownPeer, target.id.ShortString())
	}
	if target.dead.Load() {
		if p.net.blackhole {
			<-ctx.Done()
			return fmt.Errorf("memnet: call %s: %w", target.id.ShortString(), ctx.Err())
		}
		return fmt.Errorf("%w: %s", ErrUnreachable, target.id.ShortString())
	}
	return nil
}
