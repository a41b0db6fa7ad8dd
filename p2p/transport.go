// Package p2p connects Skyhive peers: a go-libp2p host (TCP and QUIC, TLS)
// and a request/response RPC layer on its streams.
package p2p

import (
	"context"
	"fmt"

	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/core/protocol"
	ma "github.com/multiformats/go-multiaddr"
)

// Handler answers one request. A returned error reaches the caller as a
// *RemoteError carrying its message.
type Handler func(ctx context.Context, from peer.ID, req []byte) ([]byte, error)

// Transport is what the DHT, the expert client and the averager need from
// the network: an identity, handlers per protocol and request/response calls.
// *Host implements it over libp2p; package memnet implements it in memory
// for simulated swarms of thousands of peers.
type Transport interface {
	// ID is this peer's identity.
	ID() peer.ID
	// AddrInfo is this peer's identity with the addresses it listens on.
	AddrInfo() peer.AddrInfo
	// SetHandler registers h for proto, replacing any earlier handler.
	SetHandler(proto protocol.ID, h Handler)
	// Call sends req to peer to over proto and waits for the response,
	// honouring ctx's deadline.
	Call(ctx context.Context, to peer.AddrInfo, proto protocol.ID, req []byte) ([]byte, error)
}

// RemoteError is an error returned by the remote handler.
type RemoteError struct {
	Peer  peer.ID
	Proto protocol.ID
	Msg   string
}

func (e *RemoteError) Error() string {
	return fmt.Sprintf("peer %s (%s): %s", e.Peer.ShortString(), e.Proto, e.Msg)
}

// ParseAddrInfos parses multiaddrs that end in /p2p/PEER_ID, merging
// addresses of the same peer; errors say what a good address looks like.
func ParseAddrInfos(addrs []string) ([]peer.AddrInfo, error) {
	var mas []ma.Multiaddr
	for _, s := range addrs {
		a, err := ma.NewMultiaddr(s)
		if err != nil {
			return nil, fmt.Errorf("address %q: %w", s, err)
		}
		mas = append(mas, a)
	}
	infos, err := peer.AddrInfosFromP2pAddrs(mas...)
	if err != nil {
		return nil, fmt.Errorf("addresses must end in /p2p/PEER_ID: %w", err)
	}
	return infos, nil
}
