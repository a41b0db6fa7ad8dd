package pipeline

import (
	"errors"
	"fmt"
	"slices"
	"sync"

	"github.com/libp2p/go-libp2p/core/peer"
	ma "github.com/multiformats/go-multiaddr"

	"github.com/skyhive/skyhive/netem"
)

// CoordinatorKey is the coordinator's key in an emulated network; workers
// are keyed by their names.
const CoordinatorKey = peer.ID("coordinator")

// emulation routes every pipeline connection through netem loopback
// proxies: one proxy per ordered pair of peers, shaping what the dialer
// sends as the link dialer→target and the replies as target→dialer. A
// libp2p connection carries both directions, so traffic between two peers
// is shaped whichever of them dialed.
//
// It is the coordinator's router under emulated links: a worker must name
// a region of the network and a name no other worker has (names key the
// links), and every address handed out is a proxy's.
type emulation struct {
	n *netem.Network

	mu      sync.Mutex
	proxies map[[2]peer.ID]*netem.Proxy
	names   map[string]peer.ID // registered workers
}

var _ router = (*emulation)(nil)

func (e *emulation) admit(name, region string, real peer.AddrInfo) (peer.AddrInfo, error) {
	if name == "" || !slices.Contains(e.n.Profile().Regions, region) {
		return peer.AddrInfo{}, fmt.Errorf("pipeline: with emulated links a worker needs a name and one of the regions %v (got %q, %q)", e.n.Profile().Regions, name, region)
	}
	e.mu.Lock()
	id, taken := e.names[name]
	if !taken || id == real.ID {
		if e.names == nil {
			e.names = map[string]peer.ID{}
		}
		e.names[name] = real.ID
	}
	e.mu.Unlock()
	if taken && id != real.ID {
		return peer.AddrInfo{}, fmt.Errorf("pipeline: worker name %q taken (names key the emulated links)", name)
	}
	if err := e.n.Assign(peer.ID(name), region); err != nil {
		return peer.AddrInfo{}, fmt.Errorf("pipeline: %w", err)
	}
	return e.route(string(CoordinatorKey), name, real)
}

func (e *emulation) route(from, to string, real peer.AddrInfo) (peer.AddrInfo, error) {
	a, err := e.proxy(peer.ID(from), peer.ID(to), real.Addrs)
	if err != nil {
		return peer.AddrInfo{}, err
	}
	return peer.AddrInfo{ID: real.ID, Addrs: []ma.Multiaddr{a}}, nil
}

func (e *emulation) join(name, region string, coord peer.AddrInfo) (peer.AddrInfo, error) {
	if region == "" {
		return peer.AddrInfo{}, errors.New("pipeline: the coordinator emulates links: give every local worker a region")
	}
	if err := e.n.Assign(peer.ID(name), region); err != nil {
		return peer.AddrInfo{}, fmt.Errorf("pipeline: worker %s: %w", name, err)
	}
	return e.route(name, string(CoordinatorKey), coord)
}

func (e *emulation) pinned() bool { return true }

// proxy returns the proxy address through which from reaches to at target
// (a TCP multiaddr of to), starting the proxy on first use.
func (e *emulation) proxy(from, to peer.ID, target []ma.Multiaddr) (ma.Multiaddr, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	key := [2]peer.ID{from, to}
	px := e.proxies[key]
	if px == nil {
		addr, err := tcpTarget(target)
		if err != nil {
			return nil, fmt.Errorf("pipeline: route %s→%s: %w", from, to, err)
		}
		if px, err = e.n.Proxy(from, to, addr); err != nil {
			return nil, fmt.Errorf("pipeline: route %s→%s: %w", from, to, err)
		}
		if e.proxies == nil {
			e.proxies = map[[2]peer.ID]*netem.Proxy{}
		}
		e.proxies[key] = px
	}
	return tcpMultiaddr(px.Addr())
}

// close stops every proxy.
func (e *emulation) close() {
	e.mu.Lock()
	defer e.mu.Unlock()
	for _, px := range e.proxies {
		px.Close()
	}
	e.proxies = nil
}

// tcpTarget picks the first /ip4/…/tcp/… address as host:port.
func tcpTarget(addrs []ma.Multiaddr) (string, error) {
	for _, a := range addrs {
		ip, err1 := a.ValueForProtocol(ma.P_IP4)
		port, err2 := a.ValueForProtocol(ma.P_TCP)
		if err1 == nil && err2 == nil {
			return ip + ":" + port, nil
		}
	}
	return "", fmt.Errorf("no IPv4 TCP address among %v (emulated links proxy TCP only)", addrs)
}

// tcpMultiaddr turns "127.0.0.1:port" into /ip4/127.0.0.1/tcp/port.
func tcpMultiaddr(hostPort string) (ma.Multiaddr, error) {
	for i := len(hostPort) - 1; i >= 0; i-- {
		if hostPort[i] == ':' {
			return ma.NewMultiaddr("/ip4/" + hostPort[:i] + "/tcp/" + hostPort[i+1:])
		}
	}
	return nil, fmt.Errorf("pipeline: bad proxy address %q", hostPort)
}
