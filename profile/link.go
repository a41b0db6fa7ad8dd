package profile

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/core/protocol"

	"github.com/skyhive/skyhive/p2p"
)

// Protocols of the link measurement.
const (
	// PingProtocol echoes small requests (latency).
	PingProtocol protocol.ID = "/skyhive/profile/1.0.0"
	// BandwidthProtocol reads a streamed payload to its end and answers with
	// the byte count as 8 bytes, big-endian (bandwidth).
	BandwidthProtocol protocol.ID = "/skyhive/profile/bw/1.0.0"
)

// Defaults of LinkOptions.
const (
	DefaultPings        = 10
	DefaultPayloadBytes = 8 << 20
	DefaultBandwidthRep = 3
	DefaultLinkTimeout  = 60 * time.Second
	// maxPingBytes bounds what the ping handler echoes.
	maxPingBytes = 1024
	pingBytes    = 32
)

// Host is what link measurement needs from a p2p host; *p2p.Host
// implements it.
type Host interface {
	// ID is the host's peer identity.
	ID() peer.ID
	// Call and CallStream are p2p's request/response and streamed calls.
	Call(ctx context.Context, to peer.AddrInfo, proto protocol.ID, req []byte) ([]byte, error)
	CallStream(ctx context.Context, to peer.AddrInfo, proto protocol.ID, send func(w io.Writer) error, recv func(r io.Reader) error) error
	// SetHandler and SetStreamHandler register the answering side.
	SetHandler(proto protocol.ID, h p2p.Handler)
	SetStreamHandler(proto protocol.ID, sh p2p.StreamHandler)
}

var _ Host = (*p2p.Host)(nil)

// RegisterHandlers installs the ping and bandwidth handlers on h so that
// other peers can measure their links to it.
func RegisterHandlers(h Host) {
	h.SetHandler(PingProtocol, func(_ context.Context, _ peer.ID, req []byte) ([]byte, error) {
		if len(req) > maxPingBytes {
			return nil, fmt.Errorf("profile: ping of %d bytes is over %d", len(req), maxPingBytes)
		}
		return req, nil
	})
	h.SetStreamHandler(BandwidthProtocol, func(_ context.Context, _ peer.ID, r io.Reader, w io.Writer) error {
		n, err := io.Copy(io.Discard, r)
		if err != nil {
			return fmt.Errorf("profile: reading payload: %w", err)
		}
		var b [8]byte
		binary.BigEndian.PutUint64(b[:], uint64(n))
		_, err = w.Write(b[:])
		return err
	})
}

// LinkOptions configures MeasureLink. The zero value uses the defaults.
type LinkOptions struct {
	// Pings is the number of timed round trips after one warm-up
	// (default DefaultPings).
	Pings int
	// PayloadBytes is the size of one bandwidth transfer (default
	// DefaultPayloadBytes). On slow links choose it so that a transfer takes
	// well over a round trip but fits the timeout.
	PayloadBytes int64
	// BandwidthReps is the number of timed transfers (default
	// DefaultBandwidthRep).
	BandwidthReps int
	// Timeout bounds the whole measurement of one link (default
	// DefaultLinkTimeout).
	Timeout time.Duration
	// Seed fills the payload.
	Seed uint64
}

func (o LinkOptions) withDefaults() LinkOptions {
	if o.Pings <= 0 {
		o.Pings = DefaultPings
	}
	if o.PayloadBytes <= 0 {
		o.PayloadBytes = DefaultPayloadBytes
	}
	if o.BandwidthReps <= 0 {
		o.BandwidthReps = DefaultBandwidthRep
	}
	if o.Timeout <= 0 {
		o.Timeout = DefaultLinkTimeout
	}
	return o
}

// Link is the measured path from one device to another. From and To name
// devices, by Device.Name or Device.Peer.
type Link struct {
	From string `json:"from"`
	To   string `json:"to"`
	// Latency is the one-way latency in seconds: half the median round trip.
	Latency float64 `json:"latency_s"`
	// RTTMin and RTTMax are the fastest and slowest round trips, in seconds.
	RTTMin float64 `json:"rtt_min_s,omitempty"`
	RTTMax float64 `json:"rtt_max_s,omitempty"`
	// Bandwidth from From to To in bytes per second: the median over the
	// transfers of PayloadBytes / (transfer time − median round trip).
	// Zero means unknown (treated as unlimited by the allocator).
	Bandwidth float64 `json:"bandwidth_bytes_per_s"`
	// PayloadBytes is the size of one bandwidth transfer (0: entered by
	// hand).
	PayloadBytes int64 `json:"payload_bytes,omitempty"`
}

// MeasureLink measures the link from h to the peer, which must run
// RegisterHandlers: Pings round trips of a small message, then
// BandwidthReps streamed transfers of PayloadBytes to it.
func MeasureLink(ctx context.Context, h Host, to peer.AddrInfo, o LinkOptions) (Link, error) {
	o = o.withDefaults()
	ctx, cancel := context.WithTimeout(ctx, o.Timeout)
	defer cancel()
	rng := rand.New(rand.NewPCG(o.Seed, 0xb5ad4eceda1ce2a9))

	ping := make([]byte, pingBytes)
	rtts := make([]float64, 0, o.Pings)
	for i := -1; i < o.Pings; i++ { // i = -1 is the warm-up (connection set-up)
		for j := range ping {
			ping[j] = byte(rng.Uint32())
		}
		t0 := time.Now()
		resp, err := h.Call(ctx, to, PingProtocol, ping)
		if err != nil {
			return Link{}, fmt.Errorf("profile: ping %s: %w", to.ID, err)
		}
		rtt := time.Since(t0).Seconds()
		if string(resp) != string(ping) {
			return Link{}, fmt.Errorf("profile: ping %s: echo differs from request", to.ID)
		}
		if i >= 0 {
			rtts = append(rtts, rtt)
		}
	}
	rtt, rttMin, rttMax := medianMinMax(rtts)

	payload := make([]byte, min(o.PayloadBytes, 1<<20))
	for j := range payload {
		payload[j] = byte(rng.Uint32())
	}
	bws := make([]float64, 0, o.BandwidthReps)
	for range o.BandwidthReps {
		t0 := time.Now()
		var got uint64
		err := h.CallStream(ctx, to, BandwidthProtocol,
			func(w io.Writer) error {
				for left := o.PayloadBytes; left > 0; {
					n := min(left, int64(len(payload)))
					if _, err := w.Write(payload[:n]); err != nil {
						return err
					}
					left -= n
				}
				return nil
			},
			func(r io.Reader) error {
				var b [8]byte
				if _, err := io.ReadFull(r, b[:]); err != nil {
					return err
				}
				got = binary.BigEndian.Uint64(b[:])
				return nil
			})
		if err != nil {
			return Link{}, fmt.Errorf("profile: bandwidth to %s: %w", to.ID, err)
		}
		el := time.Since(t0).Seconds()
		if got != uint64(o.PayloadBytes) {
			return Link{}, fmt.Errorf("profile: bandwidth to %s: peer received %d of %d bytes", to.ID, got, o.PayloadBytes)
		}
		// The transfer time includes the reply's trip back and the stream's
		// opening; subtract one round trip, but never below a tenth of the
		// elapsed time, so a payload that is small next to the round trip
		// errs towards a low bandwidth rather than an infinite one.
		bws = append(bws, float64(o.PayloadBytes)/max(el-rtt, el/10))
	}
	bw, _, _ := medianMinMax(bws)
	return Link{
		From:         h.ID().String(),
		To:           to.ID.String(),
		Latency:      rtt / 2,
		RTTMin:       rttMin,
		RTTMax:       rttMax,
		Bandwidth:    bw,
		PayloadBytes: o.PayloadBytes,
	}, nil
}

// MeasureLinks measures the links from h to each peer in turn (one at a time,
// so that transfers do not share bandwidth). It returns the links it could
// measure and, joined, an error for every peer it could not, so one dead peer
// does not hide the others.
func MeasureLinks(ctx context.Context, h Host, peers []peer.AddrInfo, o LinkOptions) ([]Link, error) {
	var links []Link
	var errs []error
	for _, p := range peers {
		if p.ID == h.ID() {
			continue
		}
		if err := ctx.Err(); err != nil {
			errs = append(errs, fmt.Errorf("profile: measuring links: %w", err))
			break
		}
		l, err := MeasureLink(ctx, h, p, o)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		links = append(links, l)
	}
	return links, errors.Join(errs...)
}
