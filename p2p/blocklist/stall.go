package blocklist

import (
	"context"
	"net"
	"sync"
	"time"

	"github.com/libp2p/go-libp2p/core/crypto"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/core/protocol"
	"github.com/libp2p/go-libp2p/core/sec"
	tptu "github.com/libp2p/go-libp2p/p2p/net/upgrader"
)

// stallPoll is how often a stalled connection checks whether its peer's
// block ended.
const stallPoll = 100 * time.Millisecond

// Stalling wraps a security transport's constructor so that its
// connections stop reading while the remote peer is blocked on l (see
// Block). A blocked peer's bytes then wait in its own socket buffers
// and TCP's flow control stops it sending: the victim neither decrypts nor
// discards them. Writes go on, so the peer still gets the answer that told
// it why; the multiplexer's keep-alive ends the connection in time, and the
// connection gater refuses new ones until the block ends.
func Stalling[T sec.SecureTransport](newT func(protocol.ID, crypto.PrivKey, []tptu.StreamMuxer) (T, error), l *List) func(protocol.ID, crypto.PrivKey, []tptu.StreamMuxer) (sec.SecureTransport, error) {
	return func(id protocol.ID, key crypto.PrivKey, muxers []tptu.StreamMuxer) (sec.SecureTransport, error) {
		t, err := newT(id, key, muxers)
		if err != nil {
			return nil, err
		}
		return &stallTransport{SecureTransport: t, l: l}, nil
	}
}

// stallTransport is a security transport whose connections stall while
// their peer is blocked.
type stallTransport struct {
	sec.SecureTransport
	l *List
}

// SecureInbound secures an inbound connection.
func (t *stallTransport) SecureInbound(ctx context.Context, c net.Conn, p peer.ID) (sec.SecureConn, error) {
	sc, err := t.SecureTransport.SecureInbound(ctx, c, p)
	return t.wrap(sc, err)
}

// SecureOutbound secures an outbound connection.
func (t *stallTransport) SecureOutbound(ctx context.Context, c net.Conn, p peer.ID) (sec.SecureConn, error) {
	sc, err := t.SecureTransport.SecureOutbound(ctx, c, p)
	return t.wrap(sc, err)
}

func (t *stallTransport) wrap(sc sec.SecureConn, err error) (sec.SecureConn, error) {
	if err != nil {
		return nil, err
	}
	return &stallConn{SecureConn: sc, l: t.l, closed: make(chan struct{})}, nil
}

// stallConn is a secured connection that does not read while its remote
// peer is blocked.
type stallConn struct {
	sec.SecureConn
	l      *List
	once   sync.Once
	closed chan struct{}
}

// Read waits while the remote peer is blocked, then reads.
func (c *stallConn) Read(b []byte) (int, error) {
	if c.l.blockedFast(c.RemotePeer()) {
		t := time.NewTimer(stallPoll)
		defer t.Stop()
		for c.l.blockedFast(c.RemotePeer()) {
			select {
			case <-c.closed:
				return 0, net.ErrClosed
			case <-t.C:
				t.Reset(stallPoll)
			}
		}
	}
	return c.SecureConn.Read(b)
}

// Close ends a stalled Read and closes the connection.
func (c *stallConn) Close() error {
	c.once.Do(func() { close(c.closed) })
	return c.SecureConn.Close()
}
