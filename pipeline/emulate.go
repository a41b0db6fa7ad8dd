package pipeline

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"
	ma "github.com/multiformats/go-multiaddr"

	"github.com/skyhive/skyhive/alloc"
	"github.com/skyhive/skyhive/netem"
	"github.com/skyhive/skyhive/p2p"
	"github.com/skyhive/skyhive/wire"
)

// CoordinatorKey is the coordinator's key in an emulated network; workers
// are keyed by their names.
const CoordinatorKey = peer.ID("coordinator")

// emulation routes every pipeline connection through netem loopback
// proxies: one proxy per ordered pair of peers, shaping what the dialer
// sends as the link dialer→target and the replies as target→dialer. A
// libp2p connection carries both directions, so traffic between two peers
// is shaped whichever of them dialed.
type emulation struct {
	n *netem.Network

	mu      sync.Mutex
	proxies map[[2]peer.ID]*netem.Proxy
}

// route returns the proxy address through which from reaches to at target
// (a TCP multiaddr of to), starting the proxy on first use.
func (e *emulation) route(from, to peer.ID, target []ma.Multiaddr) (ma.Multiaddr, error) {
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

// probeReq asks a worker to measure its link to Peer (over the address
// given, i.e. the route its activations would take).
type probeReq struct {
	Peer PeerRef `json:"peer"`
}

type probeResp struct {
	Latency   float64 `json:"latency"`   // one-way seconds
	Bandwidth float64 `json:"bandwidth"` // bytes per second, 0 if unmeasurable
}

// measurePing estimates the link from h to peer: latency is half the
// median empty round trip; bandwidth is what a one-way payload adds to
// it, with the payload sized to take about 150 ms (64 KiB to 8 MiB).
func measurePing(ctx context.Context, h p2p.Transport, to peer.AddrInfo) (alloc.Link, error) {
	call := func(payload []byte) (float64, error) {
		cctx, cancel := context.WithTimeout(ctx, 20*time.Second)
		defer cancel()
		t0 := time.Now()
		if _, err := h.Call(cctx, to, ProtoPing, payload); err != nil {
			return 0, err
		}
		return time.Since(t0).Seconds(), nil
	}
	var rtts []float64
	for i := range 6 {
		d, err := call(nil)
		if err != nil {
			return alloc.Link{}, err
		}
		if i > 0 {
			rtts = append(rtts, d)
		}
	}
	rtt := median(rtts)
	size := 64 << 10
	var bws []float64
	for i := range 4 {
		d, err := call(make([]byte, size))
		if err != nil {
			return alloc.Link{}, err
		}
		extra := d - rtt
		if i == 0 {
			// Size the measured transfers from this first estimate.
			if extra > 0 {
				size = int(min(max(float64(size)/extra*0.15, 64<<10), 8<<20))
			} else {
				size = 8 << 20
			}
			continue
		}
		if extra > 0 {
			bws = append(bws, float64(size)/extra)
		}
	}
	l := alloc.Link{Latency: rtt / 2}
	if len(bws) > 0 {
		l.Bandwidth = median(bws)
	}
	return l, nil
}

// onProbe measures the link to the requested peer.
func (w *Worker) onProbe(ctx context.Context, b []byte) ([]byte, error) {
	var req probeReq
	if _, err := decodeMsg(b, &req, wire.Limits{}); err != nil {
		return nil, err
	}
	ai, err := req.Peer.addrInfo()
	if err != nil {
		return nil, err
	}
	if ai.ID == "" || ai.ID == w.tr.ID() {
		return nil, errors.New("pipeline: probe needs another peer")
	}
	if len(ai.Addrs) > 0 {
		pinAddrs(w.tr, ai.ID, ai.Addrs)
	}
	l, err := measurePing(ctx, w.tr, ai)
	if err != nil {
		return nil, err
	}
	return encodeMsg(probeResp{Latency: l.Latency, Bandwidth: l.Bandwidth}, nil)
}

// probe measures the link from worker from (−1: the coordinator) to
// worker to, over the route the pipeline would use.
func (c *Coordinator) probe(ctx context.Context, from, to int) (alloc.Link, error) {
	if from < 0 {
		return measurePing(ctx, c.tr, c.worker(to).peerInfo(c))
	}
	ref, err := c.routeRef(from, to)
	if err != nil {
		return alloc.Link{}, err
	}
	cctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	var resp probeResp
	if _, err := c.call(cctx, from, ProtoProbe, probeReq{Peer: ref}, nil, &resp, wire.Limits{}); err != nil {
		return alloc.Link{}, err
	}
	if !(resp.Latency >= 0) || !(resp.Bandwidth >= 0) {
		return alloc.Link{}, fmt.Errorf("pipeline: bad probe result %+v", resp)
	}
	return alloc.Link{Latency: resp.Latency, Bandwidth: resp.Bandwidth}, nil
}

// routeRef is how worker from reaches worker to: through its emulated
// route, or at the addresses to registered with.
func (c *Coordinator) routeRef(from, to int) (PeerRef, error) {
	src, dst := c.worker(from), c.worker(to)
	c.mu.Lock()
	name, real := src.Name, dst.real
	dname := dst.Name
	c.mu.Unlock()
	if c.emu == nil {
		return refOf(real), nil
	}
	a, err := c.emu.route(peer.ID(name), peer.ID(dname), real.Addrs)
	if err != nil {
		return PeerRef{}, err
	}
	return refOf(peer.AddrInfo{ID: real.ID, Addrs: []ma.Multiaddr{a}}), nil
}

// JoinAddr prepares the coordinator for a local worker named name in
// region and returns the --join address it should use: the coordinator's
// address, or under emulated links the route from name to the
// coordinator, once name is assigned to region (which must then be one
// of the network's). It implements swarm.PipelineCoordinator.
func (c *Coordinator) JoinAddr(name, region string) (string, error) {
	if c.emu != nil {
		if region == "" {
			return "", errors.New("pipeline: the coordinator emulates links: give every local worker a region")
		}
		if err := c.emu.n.Assign(peer.ID(name), region); err != nil {
			return "", fmt.Errorf("pipeline: worker %s: %w", name, err)
		}
	}
	return c.joinRoute(name)
}

// joinRoute returns the --join address a local worker named name should
// use: the coordinator's address, or under emulation the route from name
// to the coordinator.
func (c *Coordinator) joinRoute(name string) (string, error) {
	addrs := c.Addrs()
	if len(addrs) == 0 {
		return "", errors.New("pipeline: coordinator has no address")
	}
	if c.emu == nil {
		return addrs[0], nil
	}
	ai := c.tr.AddrInfo()
	a, err := c.emu.route(peer.ID(name), CoordinatorKey, ai.Addrs)
	if err != nil {
		return "", err
	}
	p2pAddrs, err := peer.AddrInfoToP2pAddrs(&peer.AddrInfo{ID: ai.ID, Addrs: []ma.Multiaddr{a}})
	if err != nil {
		return "", fmt.Errorf("pipeline: join route: %w", err)
	}
	return p2pAddrs[0].String(), nil
}

// Network returns the emulated network, or nil.
func (c *Coordinator) Network() *netem.Network {
	if c.emu == nil {
		return nil
	}
	return c.emu.n
}

// regionKnown reports whether the emulated network has the region.
func (e *emulation) regionKnown(r string) bool {
	return slices.Contains(e.n.Profile().Regions, r)
}

// peerKey is the emulated-network key of a worker name.
func peerKey(name string) peer.ID { return peer.ID(name) }
