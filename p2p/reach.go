package p2p

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/libp2p/go-libp2p/core/event"
	"github.com/libp2p/go-libp2p/core/network"
	relayclient "github.com/libp2p/go-libp2p/p2p/protocol/circuitv2/client"
	ma "github.com/multiformats/go-multiaddr"
	manet "github.com/multiformats/go-multiaddr/net"
)

// Reach says how other peers can reach a host.
type Reach struct {
	// Reachability is AutoNAT's last verdict, or the configured one;
	// ReachabilityAuto while unknown.
	Reachability Reachability `json:"-"`
	// Status is one of "public", "relay", "unreachable", "local" (only
	// loopback or private-network addresses, reachability unknown) or
	// "unknown".
	Status string `json:"status"`
	// Addrs are the addresses to give others, each ending in /p2p/ID;
	// Relayed are those through a relay.
	Addrs   []string `json:"addrs"`
	Relayed []string `json:"relayed,omitempty"`
	// Advice says what to do when others may not reach the host; empty
	// when they can.
	Advice string `json:"advice,omitempty"`
}

// String is a one-line summary.
func (r Reach) String() string {
	s := "reachability: " + r.Status
	if r.Advice != "" {
		s += " (" + r.Advice + ")"
	}
	return s
}

// Reach reports the host's addresses and how others can reach it.
func (h *Host) Reach() Reach {
	return classifyReach(h.reachability(), h.AddrInfo().Addrs, "/p2p/"+h.ID().String())
}

// WatchReach calls f with the host's Reach now and whenever AutoNAT's
// verdict changes, until ctx ends or the host closes.
func (h *Host) WatchReach(ctx context.Context, f func(Reach)) error {
	sub, err := h.h.EventBus().Subscribe(new(event.EvtLocalReachabilityChanged))
	if err != nil {
		return fmt.Errorf("p2p: watch reachability: %w", err)
	}
	defer sub.Close()
	last := h.Reach()
	f(last)
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-h.ctx.Done():
			return nil
		case _, ok := <-sub.Out():
			if !ok {
				return nil
			}
			if r := h.Reach(); r.Status != last.Status {
				last = r
				f(r)
			}
		}
	}
}

// reachability is the configured reachability, or AutoNAT's last verdict.
func (h *Host) reachability() Reachability {
	if h.cfg.Reachability != ReachabilityAuto {
		return h.cfg.Reachability
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	for {
		select {
		case e, ok := <-h.reachSub.Out():
			if !ok {
				return h.seen
			}
			switch e.(event.EvtLocalReachabilityChanged).Reachability {
			case network.ReachabilityPublic:
				h.seen = ReachabilityPublic
			case network.ReachabilityPrivate:
				h.seen = ReachabilityPrivate
			default:
				h.seen = ReachabilityAuto
			}
		default:
			return h.seen
		}
	}
}

// classifyReach is the pure core of Reach: the status and advice for a
// verdict and a host's addresses; suffix (/p2p/ID) is appended to each.
func classifyReach(r Reachability, addrs []ma.Multiaddr, suffix string) Reach {
	out := Reach{Reachability: r}
	public := false
	for _, a := range addrs {
		s := a.String() + suffix
		if isRelayed(a) {
			out.Relayed = append(out.Relayed, s)
		} else if manet.IsPublicAddr(a) {
			public = true
		}
		out.Addrs = append(out.Addrs, s)
	}
	const relayHint = "pass --relay ADDR of a public peer started with --relay-service"
	switch {
	case r == ReachabilityPublic:
		out.Status = "public"
	case r == ReachabilityPrivate && len(out.Relayed) > 0:
		out.Status = "relay"
		out.Advice = "others reach this peer through a relay, which is slower; forward a port and pass --announce for direct connections"
	case r == ReachabilityPrivate:
		out.Status = "unreachable"
		out.Advice = "peers outside this network cannot dial it: forward a port and pass --announce /ip4/PUBLIC_IP/tcp/PORT, or " + relayHint
	case !public:
		out.Status = "local"
		out.Advice = "it listens only on loopback or private addresses: peers on other networks need --listen /ip4/0.0.0.0/tcp/PORT with a forwarded port, or " + relayHint
	default:
		out.Status = "unknown"
		out.Advice = "AutoNAT has no verdict yet; `skyhive doctor --dht ADDR` asks the swarm to dial back"
	}
	return out
}

// isRelayed reports whether a is a circuit-relay address.
func isRelayed(a ma.Multiaddr) bool {
	return strings.Contains(a.String(), "/p2p-circuit")
}

// ErrRelay means no static relay granted a reservation.
var ErrRelay = errors.New("p2p: no relay granted a reservation")

// checkRelays reserves a slot on each of Config.StaticRelays, so that
// relays that are down or refuse (no relay service, or not publicly
// reachable) are an error at start rather than a silent absence of relayed
// addresses. One grant is enough. The granted relays' circuit addresses
// are announced in AddrInfo (libp2p's autorelay announces only relays with
// public addresses, which leaves out relays on private networks), and the
// reservations are renewed while the host runs.
func (h *Host) checkRelays(ctx context.Context) error {
	if len(h.cfg.StaticRelays) == 0 {
		return nil
	}
	circuits, errs := h.reserve(ctx)
	if len(circuits) == 0 {
		return fmt.Errorf("%w: %w", ErrRelay, errors.Join(errs...))
	}
	h.setCircuits(circuits)
	h.renewing.Add(1)
	go h.renewRelays()
	return nil
}

// reserve asks every static relay for a slot and returns the circuit
// addresses of those that grant one, and the others' errors.
func (h *Host) reserve(ctx context.Context) ([]ma.Multiaddr, []error) {
	var errs []error
	var circuits []ma.Multiaddr
	for _, r := range h.cfg.StaticRelays {
		rctx, cancel := context.WithTimeout(ctx, relayReserveTimeout)
		_, err := relayclient.Reserve(rctx, h.h, r)
		cancel()
		if err != nil {
			errs = append(errs, fmt.Errorf("relay %s: %w", r.ID.ShortString(), err))
			continue
		}
		circuits = append(circuits, CircuitAddrs(r)...)
	}
	return circuits, errs
}

func (h *Host) setCircuits(c []ma.Multiaddr) {
	h.mu.Lock()
	h.circuits = c
	h.mu.Unlock()
}

// Reservations last an hour (libp2p's relay service); renew well before.
const (
	relayRenewEvery     = 20 * time.Minute
	relayReserveTimeout = 20 * time.Second
)

// renewRelays renews the reservations until the host closes. A renewal
// that no relay grants keeps the previous addresses (the next one may).
func (h *Host) renewRelays() {
	defer h.renewing.Done()
	t := time.NewTicker(relayRenewEvery)
	defer t.Stop()
	for {
		select {
		case <-h.ctx.Done():
			return
		case <-t.C:
		}
		circuits, errs := h.reserve(h.ctx)
		if len(circuits) == 0 {
			h.log.Warn("no relay renewed its reservation", "errors", errors.Join(errs...))
			continue
		}
		h.setCircuits(circuits)
	}
}

// CircuitAddrs returns the addresses through which a relay's clients are
// reached: each of its addresses followed by /p2p/RELAY/p2p-circuit.
func CircuitAddrs(relay peer.AddrInfo) []ma.Multiaddr {
	var out []ma.Multiaddr
	for _, a := range relay.Addrs {
		c, err := ma.NewMultiaddr(a.String() + "/p2p/" + relay.ID.String() + "/p2p-circuit")
		if err == nil {
			out = append(out, c)
		}
	}
	return out
}
