package netem

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/skyhive/skyhive/clock"
)

// Errors returned (wrapped) by Network methods.
var (
	// ErrUnreachable means the link is cut by a partition, a block or a
	// crashed endpoint.
	ErrUnreachable = errors.New("netem: peer unreachable")
	// ErrLost means the message was dropped by the link's loss model.
	ErrLost = errors.New("netem: message lost")
	// ErrUnknownPeer means the peer was never assigned to a region.
	ErrUnknownPeer = errors.New("netem: peer not assigned to a region")
)

// Network is the emulated network: peers mapped to regions, the links
// between them, and the partitions and crashes currently in force. It is safe
// for concurrent use.
//
// Each directed link is a serializing queue: a message of size bytes occupies
// the link for size*8/Bandwidth seconds after the link becomes free, so
// concurrent transfers share the bandwidth; then it travels for
// Latency ± Jitter. Jitter and loss are drawn from a per-link generator
// seeded from the network seed and the two peer keys, so a given sequence of
// messages on a link sees the same delays and losses in every run.
type Network struct {
	profile *Profile
	seed    uint64
	clk     clock.Clock

	mu        sync.Mutex
	region    map[peer.ID]string
	overrides map[pair]LinkParams
	links     map[pair]*linkState
	blocked   map[pair]bool
	group     map[peer.ID]int
	crashed   map[peer.ID]bool
}

type pair struct{ from, to peer.ID }

type linkState struct {
	busyUntil  time.Time // when the link finishes serializing its backlog
	lastArrive time.Time // arrival of the latest message, for FIFO order
	rng        *rand.Rand
}

// Transit is the emulated fate of one message on a link.
type Transit struct {
	// Sent is when the last bit leaves the sender (serialization done).
	Sent time.Time
	// Arrive is when the last bit reaches the receiver.
	Arrive time.Time
	// Lost reports that the loss model dropped the message.
	Lost bool
}

// Option configures a Network (New) or a NICLink (NewNICLink).
type Option func(*options)

type options struct {
	clock clock.Clock
}

// WithClock makes the emulation read the time and sleep on c instead of
// the wall clock: link schedules, Deliver, the delay lines and write
// deadlines of Conn and Proxy, and Topology's router. Tests pass a
// clock.Fake to step through transfers deterministically. A nil c means
// the wall clock.
func WithClock(c clock.Clock) Option { return func(o *options) { o.clock = c } }

func buildOptions(opts []Option) options {
	var o options
	for _, f := range opts {
		f(&o)
	}
	o.clock = clock.Or(o.clock)
	return o
}

// New returns a network over profile p. Peers must be assigned to regions
// with Assign before they send or receive. It runs on the wall clock unless
// WithClock says otherwise.
func New(p *Profile, seed uint64, opts ...Option) (*Network, error) {
	if p == nil {
		return nil, errors.New("netem: nil profile")
	}
	if err := p.Validate(); err != nil {
		return nil, err
	}
	return &Network{
		profile:   p,
		seed:      seed,
		clk:       buildOptions(opts).clock,
		region:    make(map[peer.ID]string),
		overrides: make(map[pair]LinkParams),
		links:     make(map[pair]*linkState),
		blocked:   make(map[pair]bool),
		group:     make(map[peer.ID]int),
		crashed:   make(map[peer.ID]bool),
	}, nil
}

// Clock returns the clock the network runs on.
func (n *Network) Clock() clock.Clock { return n.clk }

// Profile returns the network's profile.
func (n *Network) Profile() *Profile { return n.profile }

// Assign places peer id in the named region, replacing an earlier
// assignment. Any string can serve as a key: peer.ID("p3") is fine.
func (n *Network) Assign(id peer.ID, region string) error {
	if _, ok := n.profile.RegionIndex(region); !ok {
		return fmt.Errorf("netem: assigning %s: unknown region %q (have %v)", id, region, n.profile.Regions)
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	n.region[id] = region
	return nil
}

// Region returns the region of peer id.
func (n *Network) Region(id peer.ID) (string, bool) {
	n.mu.Lock()
	defer n.mu.Unlock()
	r, ok := n.region[id]
	return r, ok
}

// SetLink overrides the profile for the directed link from -> to.
func (n *Network) SetLink(from, to peer.ID, p LinkParams) error {
	if err := p.Validate(); err != nil {
		return fmt.Errorf("netem: link %s -> %s: %w", from, to, err)
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	n.overrides[pair{from, to}] = p
	return nil
}

// Params returns the parameters in force for the directed link from -> to.
func (n *Network) Params(from, to peer.ID) (LinkParams, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.paramsLocked(from, to)
}

func (n *Network) paramsLocked(from, to peer.ID) (LinkParams, error) {
	if p, ok := n.overrides[pair{from, to}]; ok {
		return p, nil
	}
	ra, ok := n.region[from]
	if !ok {
		return LinkParams{}, fmt.Errorf("%w: %s", ErrUnknownPeer, from)
	}
	rb, ok := n.region[to]
	if !ok {
		return LinkParams{}, fmt.Errorf("%w: %s", ErrUnknownPeer, to)
	}
	return n.profile.Link(ra, rb)
}

// Block cuts the directed link from -> to until Unblock or Heal.
func (n *Network) Block(from, to peer.ID) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.blocked[pair{from, to}] = true
}

// Unblock restores the directed link from -> to.
func (n *Network) Unblock(from, to peer.ID) {
	n.mu.Lock()
	defer n.mu.Unlock()
	delete(n.blocked, pair{from, to})
}

// Partition splits the listed peers into groups that cannot reach each
// other, replacing any earlier partition. Two peers are cut off when both are
// listed and in different groups; peers not listed are unaffected.
func (n *Network) Partition(groups ...[]peer.ID) {
	n.mu.Lock()
	defer n.mu.Unlock()
	clear(n.group)
	for g, ids := range groups {
		for _, id := range ids {
			n.group[id] = g
		}
	}
}

// Heal removes all partitions and blocks (crashes stay).
func (n *Network) Heal() {
	n.mu.Lock()
	defer n.mu.Unlock()
	clear(n.group)
	clear(n.blocked)
}

// Crash makes peer id unreachable in both directions until Recover.
func (n *Network) Crash(id peer.ID) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.crashed[id] = true
}

// Recover undoes Crash.
func (n *Network) Recover(id peer.ID) {
	n.mu.Lock()
	defer n.mu.Unlock()
	delete(n.crashed, id)
}

// Reachable reports whether from can currently send to to.
func (n *Network) Reachable(from, to peer.ID) bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.reachableLocked(from, to) == nil
}

func (n *Network) reachableLocked(from, to peer.ID) error {
	switch {
	case n.crashed[from]:
		return fmt.Errorf("%w: %s is crashed", ErrUnreachable, from)
	case n.crashed[to]:
		return fmt.Errorf("%w: %s is crashed", ErrUnreachable, to)
	case n.blocked[pair{from, to}]:
		return fmt.Errorf("%w: link %s -> %s is blocked", ErrUnreachable, from, to)
	}
	ga, oka := n.group[from]
	gb, okb := n.group[to]
	if oka && okb && ga != gb {
		return fmt.Errorf("%w: %s and %s are partitioned", ErrUnreachable, from, to)
	}
	return nil
}

// Transmit schedules one message of size bytes on the link from -> to and
// returns its fate, without waiting. Callers that emulate a transfer sleep
// until Sent (the sender is busy) and deliver at Arrive.
func (n *Network) Transmit(from, to peer.ID, size int) (Transit, error) {
	return n.transmit(from, to, size, -1)
}

// errQueueFull reports a tail drop by transmit's backlog limit.
var errQueueFull = errors.New("netem: link queue full")

// transmit is Transmit with an optional limit on the link's backlog: when
// maxBacklog >= 0 and the link is already busy for longer than that, the
// message is refused with errQueueFull and does not occupy the link.
func (n *Network) transmit(from, to peer.ID, size int, maxBacklog time.Duration) (Transit, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if err := n.reachableLocked(from, to); err != nil {
		return Transit{}, err
	}
	p, err := n.paramsLocked(from, to)
	if err != nil {
		return Transit{}, err
	}
	ls := n.linkLocked(from, to)
	now := n.clk.Now()
	start := now
	if ls.busyUntil.After(now) {
		if maxBacklog >= 0 && ls.busyUntil.Sub(now) > maxBacklog {
			return Transit{}, errQueueFull
		}
		start = ls.busyUntil
	}
	// Draw both numbers every time so the sequence does not depend on
	// earlier outcomes.
	u, v := ls.rng.Float64(), ls.rng.Float64()
	sent := start.Add(p.serialization(size))
	ls.busyUntil = sent
	delay := p.Latency
	if p.Jitter > 0 {
		delay += time.Duration((2*u - 1) * float64(p.Jitter))
		delay = max(delay, 0)
	}
	t := Transit{Sent: sent, Arrive: sent.Add(delay), Lost: v < p.Loss}
	if t.Arrive.Before(ls.lastArrive) {
		t.Arrive = ls.lastArrive
	}
	if !t.Lost {
		ls.lastArrive = t.Arrive
	}
	return t, nil
}

func (n *Network) linkLocked(from, to peer.ID) *linkState {
	k := pair{from, to}
	ls, ok := n.links[k]
	if !ok {
		h := fnv.New64a()
		h.Write([]byte(from))
		h.Write([]byte{0})
		h.Write([]byte(to))
		ls = &linkState{rng: rand.New(rand.NewPCG(n.seed, h.Sum64()))}
		n.links[k] = ls
	}
	return ls
}

// Deliver emulates sending a message of size bytes from -> to: it blocks
// for the queueing, serialization and propagation delay and returns nil when
// the message has arrived. It returns an error wrapping ErrUnreachable when
// the link is cut (checked at send and again at arrival), ErrLost once the
// sender has finished sending a message the loss model dropped, or ctx's
// error. Deliver implements p2p/memnet's Link interface.
func (n *Network) Deliver(ctx context.Context, from, to peer.ID, size int) error {
	t, err := n.Transmit(from, to, size)
	if err != nil {
		return err
	}
	if t.Lost {
		if err := n.clk.SleepUntil(ctx, t.Sent); err != nil {
			return err
		}
		return fmt.Errorf("%s -> %s (%d bytes): %w", from, to, size, ErrLost)
	}
	if err := n.clk.SleepUntil(ctx, t.Arrive); err != nil {
		return err
	}
	n.mu.Lock()
	err = n.reachableLocked(from, to)
	n.mu.Unlock()
	return err
}

// retransmitPenalty is the extra delay a lost chunk of a byte stream suffers:
// one TCP retransmission timeout, max(200 ms, 2 × round-trip latency).
func (n *Network) retransmitPenalty(from, to peer.ID) time.Duration {
	n.mu.Lock()
	defer n.mu.Unlock()
	var rtt time.Duration
	if p, err := n.paramsLocked(from, to); err == nil {
		rtt += p.Latency
	}
	if p, err := n.paramsLocked(to, from); err == nil {
		rtt += p.Latency
	}
	return max(200*time.Millisecond, 2*rtt)
}
