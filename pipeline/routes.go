package pipeline

import (
	"errors"
	"fmt"

	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/skyhive/skyhive/netem"
)

// router decides the addresses over which the coordinator and the workers
// reach each other. Registration, stage setup, link probes and the
// launcher ask it and never look at how links are emulated: direct hands
// out the addresses peers registered with; *emulation routes every pair
// of peers through its own netem proxy.
type router interface {
	// admit checks a registering worker's name and region and returns the
	// address at which the coordinator reaches it (real: where it
	// listens).
	admit(name, region string, real peer.AddrInfo) (peer.AddrInfo, error)
	// route is the address at which the worker named from reaches the
	// worker named to, which listens at real.
	route(from, to string, real peer.AddrInfo) (peer.AddrInfo, error)
	// join is the address at which a local worker named name, in region,
	// reaches the coordinator, which listens at coord.
	join(name, region string, coord peer.AddrInfo) (peer.AddrInfo, error)
	// pinned reports whether peers must reach each other only at the
	// addresses handed out (see pinAddrs).
	pinned() bool
	// close releases what the router runs.
	close()
}

// direct is the router without emulated links.
type direct struct{}

var _ router = direct{}

func (direct) admit(_, _ string, real peer.AddrInfo) (peer.AddrInfo, error) { return real, nil }
func (direct) route(_, _ string, real peer.AddrInfo) (peer.AddrInfo, error) { return real, nil }
func (direct) join(_, _ string, coord peer.AddrInfo) (peer.AddrInfo, error) { return coord, nil }
func (direct) pinned() bool                                                 { return false }
func (direct) close()                                                       {}

// routeRef is how worker from reaches worker to.
func (c *Coordinator) routeRef(from, to int) (PeerRef, error) {
	src, dst := c.worker(from), c.worker(to)
	c.mu.Lock()
	name, dname, real := src.Name, dst.Name, dst.real
	c.mu.Unlock()
	ai, err := c.routes.route(name, dname, real)
	if err != nil {
		return PeerRef{}, err
	}
	return refOf(ai), nil
}

// JoinAddr prepares the coordinator for a local worker named name in
// region and returns the --join address it should use: the coordinator's
// address, or under emulated links the route from name to the
// coordinator (region must then be one of the network's). It implements
// swarm.PipelineCoordinator.
func (c *Coordinator) JoinAddr(name, region string) (string, error) {
	ai, err := c.routes.join(name, region, c.tr.AddrInfo())
	if err != nil {
		return "", err
	}
	addrs, err := peer.AddrInfoToP2pAddrs(&ai)
	if err != nil {
		return "", fmt.Errorf("pipeline: join address: %w", err)
	}
	if len(addrs) == 0 {
		return "", errors.New("pipeline: coordinator has no address")
	}
	return addrs[0].String(), nil
}

// Network returns the emulated network, or nil.
func (c *Coordinator) Network() *netem.Network {
	if e, ok := c.routes.(*emulation); ok {
		return e.n
	}
	return nil
}
