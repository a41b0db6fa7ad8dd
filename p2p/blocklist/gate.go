package blocklist

import (
	"errors"

	"github.com/libp2p/go-libp2p/core/connmgr"
	"github.com/libp2p/go-libp2p/core/control"
	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
	ma "github.com/multiformats/go-multiaddr"
)

// Gater returns the list's connection gater: the host does not dial a
// blocked peer. It accepts their connections, which stall (see Block).
func (l *List) Gater() connmgr.ConnectionGater { return gater{l} }

type gater struct{ l *List }

func (g gater) blocked(p peer.ID) bool { return g.l.blockedFast(p) }

func (g gater) InterceptPeerDial(p peer.ID) bool                 { return !g.blocked(p) }
func (g gater) InterceptAddrDial(p peer.ID, _ ma.Multiaddr) bool { return !g.blocked(p) }
func (g gater) InterceptAccept(network.ConnMultiaddrs) bool      { return true }
func (g gater) InterceptSecured(network.Direction, peer.ID, network.ConnMultiaddrs) bool {
	return true
}
func (g gater) InterceptUpgraded(network.Conn) (bool, control.DisconnectReason) { return true, 0 }

// errBlockedStream is the resource manager's refusal of a blocked peer's
// stream.
var errBlockedStream = errors.New("blocklist: stream of a blocked peer")

// ResourceManager wraps a host's resource manager so that it refuses the
// streams of a blocked peer (see blockingRM).
func (l *List) ResourceManager(rm network.ResourceManager) network.ResourceManager {
	return &blockingRM{ResourceManager: rm, l: l}
}

// blockingRM is libp2p's resource manager, refusing the streams of a
// blocked peer: this host's own streams to it fail at once (their answers
// would never be read: a DHT lookup that asked it would wait out its
// timeout), and its streams, once it was told why, are reset as they open,
// before protocol negotiation, a handler goroutine or a reply.
type blockingRM struct {
	network.ResourceManager
	l *List
}

// OpenStream refuses a blocked peer's streams, then defers to the resource
// manager.
func (r *blockingRM) OpenStream(p peer.ID, dir network.Direction) (network.StreamManagementScope, error) {
	// Until the first Block no stream looks a peer up.
	if r.l.any.Load() {
		if dir == network.DirOutbound && r.l.Blocked(p) || dir == network.DirInbound && r.l.blockedAndTold(p) {
			return nil, errBlockedStream
		}
	}
	return r.ResourceManager.OpenStream(p, dir)
}
