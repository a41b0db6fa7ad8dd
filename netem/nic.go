package netem

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/skyhive/skyhive/clock"
)

// NICLink emulates every peer's network interface for p2p/memnet: each
// peer has an uplink and a downlink that carry one message at a time at the
// peer's bandwidth (so concurrent transfers share it), plus a fixed one-way
// latency. This is the model behind the all-reduce bandwidth bound
// 2(n−1)/n·S/B, which counts bytes through each peer's interface; package
// netem models point-to-point links instead, where a peer could send to n−1
// others at full rate at once. It implements memnet.Link and is safe for
// concurrent use.
type NICLink struct {
	latency time.Duration
	clk     clock.Clock

	mu         sync.Mutex
	defaultBW  float64
	bw         map[peer.ID]float64
	up, down   map[peer.ID]time.Time
	bytesMoved int64
}

// NewNICLink returns a link model in which every peer has bandwidth bits
// per second in each direction (0 means unlimited) and messages take
// latency to arrive. It runs on the wall clock unless WithClock says
// otherwise.
func NewNICLink(bandwidth float64, latency time.Duration, opts ...Option) *NICLink {
	return &NICLink{
		latency: latency, defaultBW: bandwidth, clk: buildOptions(opts).clock,
		bw: map[peer.ID]float64{}, up: map[peer.ID]time.Time{}, down: map[peer.ID]time.Time{},
	}
}

// SetBandwidth sets one peer's bandwidth in bits per second (0 unlimited).
func (l *NICLink) SetBandwidth(id peer.ID, bitsPerSecond float64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.bw[id] = bitsPerSecond
}

// Bandwidth returns a peer's bandwidth in bits per second.
func (l *NICLink) Bandwidth(id peer.ID) float64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.bandwidth(id)
}

func (l *NICLink) bandwidth(id peer.ID) float64 {
	if b, ok := l.bw[id]; ok {
		return b
	}
	return l.defaultBW
}

// Bytes returns the bytes delivered so far.
func (l *NICLink) Bytes() int64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.bytesMoved
}

func serialize(size int, bw float64) time.Duration {
	if bw <= 0 {
		return 0
	}
	return time.Duration(float64(size) * 8 / bw * float64(time.Second))
}

// Deliver blocks until a message of size bytes from -> to has crossed the
// sender's uplink and the receiver's downlink and the latency has passed.
func (l *NICLink) Deliver(ctx context.Context, from, to peer.ID, size int) error {
	l.mu.Lock()
	now := l.clk.Now()
	upStart := later(now, l.up[from])
	upEnd := upStart.Add(serialize(size, l.bandwidth(from)))
	l.up[from] = upEnd
	downStart := later(upStart, l.down[to])
	downEnd := later(downStart.Add(serialize(size, l.bandwidth(to))), upEnd)
	l.down[to] = downEnd
	l.bytesMoved += int64(size)
	l.mu.Unlock()
	d := downEnd.Add(l.latency).Sub(l.clk.Now())
	if d <= 0 {
		return nil
	}
	if err := l.clk.Sleep(ctx, d); err != nil {
		return fmt.Errorf("netem: link: %w", err)
	}
	return nil
}

func later(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}
