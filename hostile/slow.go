package hostile

import (
	"context"
	"encoding/binary"
	"fmt"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/core/protocol"

	"github.com/skyhive/skyhive/p2p"
)

// Slow-loris sizes: the request a slow sender claims, and how often it
// sends one byte of it.
const (
	slowClaim    = 64 << 10
	slowInterval = 250 * time.Millisecond
	// SlowTimeout is how long a slow sender keeps trickling: past the
	// request deadline of a victim with p2p's default idle timeout (30 s)
	// and minimum request rate (64 KiB/s), 31 s for the claimed 64 KiB.
	SlowTimeout = 90 * time.Second
)

// SlowLoris is a slow sender on a request/response protocol: it claims a
// request of 64 KiB and sends one byte of it every 250 ms, which no idle
// timeout notices, to hold the victim's handler and buffer. The victim
// must cut it off (its request deadline); the attack then counts as
// refused. A victim that holds it until SlowTimeout counts it as
// unanswered: a failed defence.
func SlowLoris(to peer.AddrInfo, proto protocol.ID) Attack {
	return Attack{Name: "slow-loris " + string(proto), Bytes: 4, Timeout: SlowTimeout, Victim: to.ID, Send: func(ctx context.Context, h *p2p.Host) error {
		s, err := rawStream(ctx, h, to, proto)
		if err != nil {
			return err
		}
		defer s.Reset()
		start := time.Now()
		closed := make(chan struct{})
		go func() {
			// Any answer, close or reset ends the read: the victim is done
			// with the request.
			var b [1]byte
			_, _ = s.Read(b[:])
			close(closed)
		}()
		if _, err := s.Write(binary.BigEndian.AppendUint32(nil, slowClaim)); err != nil {
			return err
		}
		tick := time.NewTicker(slowInterval)
		defer tick.Stop()
		for sent := 0; sent < slowClaim-1; sent++ {
			select {
			case <-closed:
				return fmt.Errorf("%w: cut off after %s", ErrNotAccepted, time.Since(start).Round(time.Second))
			case <-ctx.Done():
				return ctx.Err()
			case <-tick.C:
			}
			if _, err := s.Write([]byte{0}); err != nil {
				return fmt.Errorf("%w: cut off after %s: %w", ErrNotAccepted, time.Since(start).Round(time.Second), err)
			}
		}
		return nil
	}}
}
