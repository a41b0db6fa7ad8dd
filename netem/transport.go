package netem

import (
	"context"
	"fmt"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/core/protocol"

	"github.com/skyhive/skyhive/p2p"
)

// Transport wraps a p2p.Transport, typically a libp2p host, so that its
// outgoing calls cross the emulated network: the request goes from this
// peer to the callee through Network.Deliver, the real call is made, and
// the response comes back through Network.Deliver. Use it where the
// traffic does not run over p2p/memnet (whose peers take a *Network as
// their link directly). Incoming calls are not delayed.
//
// A peer the transport calls that has not been assigned to a region is
// placed in the transport's default region on first contact, so a swarm
// whose members are only learned at run time (from a DHT) needs no
// assignments beforehand.
type Transport struct {
	p2p.Transport
	net    *Network
	region string
}

// NewTransport wraps tr so that its calls cross n. tr's own peer and every
// peer it calls that has no region yet are placed in region.
func NewTransport(tr p2p.Transport, n *Network, region string) (*Transport, error) {
	if err := n.Assign(tr.ID(), region); err != nil {
		return nil, err
	}
	return &Transport{Transport: tr, net: n, region: region}, nil
}

// UniformRegion is the name of the one region of a Uniform profile, and so
// of a Delay network.
const UniformRegion = "default"

// Delay returns a one-region network (UniformRegion) in which every
// directed link has the given one-way latency and nothing else (no jitter,
// bandwidth limit or loss): the emulated round-trip time is 2·oneWay.
func Delay(oneWay time.Duration) (*Network, error) {
	return New(Uniform(LinkParams{Latency: oneWay}), 0)
}

// Call delivers the request, calls the wrapped transport and delivers the
// response, honouring ctx throughout.
func (t *Transport) Call(ctx context.Context, to peer.AddrInfo, proto protocol.ID, req []byte) ([]byte, error) {
	if _, ok := t.net.Region(to.ID); !ok {
		if err := t.net.Assign(to.ID, t.region); err != nil {
			return nil, err
		}
	}
	if err := t.net.Deliver(ctx, t.ID(), to.ID, len(req)); err != nil {
		return nil, fmt.Errorf("netem: request to %s: %w", to.ID.ShortString(), err)
	}
	resp, err := t.Transport.Call(ctx, to, proto, req)
	if err != nil {
		return nil, err
	}
	if err := t.net.Deliver(ctx, to.ID, t.ID(), len(resp)); err != nil {
		return nil, fmt.Errorf("netem: response from %s: %w", to.ID.ShortString(), err)
	}
	return resp, nil
}
