package p2p

import (
	"fmt"
	"net"

	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/core/protocol"
	ma "github.com/multiformats/go-multiaddr"
	manet "github.com/multiformats/go-multiaddr/net"
)

// Defaults of the bounds on call requests being read (Config).
const (
	// DefaultMaxPendingPerPeer is what an honest peer may open at most
	// (MaxStreamsPerPeer).
	DefaultMaxPendingPerPeer = MaxStreamsPerPeer
	// DefaultMaxPendingPerAddr is well below libp2p's streams per
	// protocol (512 before scaling with the machine's memory).
	DefaultMaxPendingPerAddr = 128
)

// pendingReads counts the call requests a host is reading, per protocol:
// per peer and per remote address (the IPv4 address, or the IPv6 /64).
// Host.mu guards it. A stream that waits for its request's bytes holds a
// libp2p stream of the protocol; bounding them per peer and per address,
// below the protocol's limit, keeps one source, however many identities it
// has, from holding all of a protocol's streams with slow requests.
type pendingReads map[protocol.ID]*protoPending

type protoPending struct {
	byPeer map[peer.ID]int
	byAddr map[string]int
}

// addrKey is the address bucket of a connection's remote address: its
// IPv4 address or IPv6 /64; "" for relayed connections (whose address is
// the relay's) and addresses without IP.
func addrKey(a ma.Multiaddr) string {
	if a == nil {
		return ""
	}
	if _, err := a.ValueForProtocol(ma.P_CIRCUIT); err == nil {
		return ""
	}
	ip, err := manet.ToIP(a)
	if err != nil {
		return ""
	}
	if v4 := ip.To4(); v4 != nil {
		return v4.String()
	}
	return ip.Mask(net.CIDRMask(64, 128)).String()
}

// enterRead counts a request being read on s, or says why the stream's
// peer or address already has too many; done uncounts it.
func (h *Host) enterRead(s network.Stream, proto protocol.ID) (done func(), err error) {
	from := s.Conn().RemotePeer()
	addr := addrKey(s.Conn().RemoteMultiaddr())
	perPeer, perAddr := h.cfg.MaxPendingPerPeer, h.cfg.MaxPendingPerAddr
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.pending == nil {
		h.pending = pendingReads{}
	}
	p := h.pending[proto]
	if p == nil {
		p = &protoPending{byPeer: map[peer.ID]int{}, byAddr: map[string]int{}}
		h.pending[proto] = p
	}
	switch {
	case p.byPeer[from] >= perPeer:
		return nil, fmt.Errorf("%w: %d of your requests of %s are still arriving; at most %d at once", ErrBusy, p.byPeer[from], proto, perPeer)
	case addr != "" && p.byAddr[addr] >= perAddr:
		return nil, fmt.Errorf("%w: %d requests of %s from your address are still arriving; at most %d at once", ErrBusy, p.byAddr[addr], proto, perAddr)
	}
	p.byPeer[from]++
	if addr != "" {
		p.byAddr[addr]++
	}
	return func() {
		h.mu.Lock()
		defer h.mu.Unlock()
		if p.byPeer[from]--; p.byPeer[from] <= 0 {
			delete(p.byPeer, from)
		}
		if addr != "" {
			if p.byAddr[addr]--; p.byAddr[addr] <= 0 {
				delete(p.byAddr, addr)
			}
		}
		if len(p.byPeer) == 0 {
			delete(h.pending, proto)
		}
	}, nil
}
