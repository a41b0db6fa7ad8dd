package pipeline

import (
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"time"

	"github.com/libp2p/go-libp2p/core/host"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/core/protocol"
	ma "github.com/multiformats/go-multiaddr"

	"github.com/skyhive/skyhive/p2p"
	"github.com/skyhive/skyhive/tensor"
	"github.com/skyhive/skyhive/wire"
)

// The coordinator and the workers need only p2p.Transport from the network:
// an identity with addresses, a handler per protocol and request/response
// calls. *p2p.Host (libp2p) and *memnet.Peer (in memory) implement it. Two
// capabilities are used when the transport has them:
//
//   - streamer: activations of one iteration and direction travel over one
//     stream (ProtoActs) instead of one call each (ProtoAct);
//   - libp2pHost: under emulated links, a peer is pinned to its route's
//     address so libp2p cannot bypass the emulating proxy.

// streamer is a transport that also carries streamed calls (*p2p.Host).
type streamer interface {
	SetStreamHandler(proto protocol.ID, h p2p.StreamHandler)
	CallStream(ctx context.Context, to peer.AddrInfo, proto protocol.ID, send func(w io.Writer) error, recv func(r io.Reader) error) error
}

// libp2pHost is a transport backed by a libp2p host (*p2p.Host).
type libp2pHost interface {
	LibP2P() host.Host
}

// pinAddrs makes t reach id only through addrs: identify may have taught
// it id's real listen addresses, and a new connection over those would
// bypass the emulated link. Existing connections are kept (they were
// dialed through a route). Transports without libp2p's address book need
// nothing.
func pinAddrs(t p2p.Transport, id peer.ID, addrs []ma.Multiaddr) {
	h, ok := t.(libp2pHost)
	if !ok {
		return
	}
	ps := h.LibP2P().Peerstore()
	ps.ClearAddrs(id)
	ps.AddAddrs(id, addrs, time.Hour)
}

// actSender ships one direction's tensors of an iteration to a neighbour,
// in order, on its own goroutine so compute overlaps communication. The
// executor depends on this interface only; tests may deliver through
// channels.
type actSender interface {
	// send queues a tensor; it never blocks.
	send(micro int, t *tensor.Tensor)
	// finish waits until everything queued is delivered and returns the
	// time spent sending.
	finish() (time.Duration, error)
}

// actDialer starts an actSender to neighbour to for the iteration of req,
// for m tensors; fail is called with the error when sending fails, which
// stops the iteration.
type actDialer func(ctx context.Context, to peer.AddrInfo, req iterReq, backward bool, m int, fail context.CancelCauseFunc) actSender

// sender is an actSender over a transport: transmit delivers the queued
// items and adds the time spent writing to comm.
type sender struct {
	ch   chan senderItem
	done chan struct{}
	comm time.Duration
	err  error
}

type senderItem struct {
	micro int
	t     *tensor.Tensor
}

// flusher is what CallStream's writer offers to push a frame out now.
type flusher interface{ Flush() error }

// transportDialer returns the actDialer of a worker on t: one stream per
// iteration and direction when t is a streamer, one call per tensor
// otherwise.
func transportDialer(t p2p.Transport) actDialer {
	return func(ctx context.Context, to peer.AddrInfo, req iterReq, backward bool, m int, fail context.CancelCauseFunc) actSender {
		hdr := actMsg{Gen: req.Gen, Iter: req.Iter, Backward: backward}
		var transmit func(first senderItem, next <-chan senderItem, comm *time.Duration) error
		if st, ok := t.(streamer); ok {
			transmit = func(first senderItem, next <-chan senderItem, comm *time.Duration) error {
				return st.CallStream(ctx, to, ProtoActs, func(wr io.Writer) error {
					return writeActs(wr, hdr, first, next, comm)
				}, nil)
			}
		} else {
			transmit = func(first senderItem, next <-chan senderItem, comm *time.Duration) error {
				for it, ok := first, true; ok; it, ok = <-next {
					b, err := encodeAct(hdr, it)
					if err != nil {
						return err
					}
					t0 := time.Now()
					if _, err := t.Call(ctx, to, ProtoAct, b); err != nil {
						return err
					}
					*comm += time.Since(t0)
				}
				return nil
			}
		}
		return startSender(to, m, fail, transmit)
	}
}

// startSender runs transmit on its own goroutine once the first tensor is
// queued.
func startSender(to peer.AddrInfo, m int, fail context.CancelCauseFunc, transmit func(first senderItem, next <-chan senderItem, comm *time.Duration) error) *sender {
	s := &sender{ch: make(chan senderItem, m), done: make(chan struct{})}
	go func() {
		defer close(s.done)
		first, ok := <-s.ch
		if !ok {
			return
		}
		if err := transmit(first, s.ch, &s.comm); err != nil {
			s.err = fmt.Errorf("send to %s: %w", to.ID.ShortString(), err)
			fail(s.err)
			for range s.ch { // drain what the schedule still queues
			}
		}
	}()
	return s
}

// encodeAct encodes one activation message.
func encodeAct(hdr actMsg, it senderItem) ([]byte, error) {
	hdr.Micro = it.micro
	return encodeMsg(hdr, []wire.Named{{Name: "t", Tensor: it.t}})
}

// writeActs writes length-prefixed activation messages to a stream,
// flushing each one as soon as it is queued, without waiting for an
// answer.
func writeActs(wr io.Writer, hdr actMsg, first senderItem, next <-chan senderItem, comm *time.Duration) error {
	for it, ok := first, true; ok; it, ok = <-next {
		b, err := encodeAct(hdr, it)
		if err != nil {
			return err
		}
		t0 := time.Now()
		if _, err := wr.Write(binary.BigEndian.AppendUint32(nil, uint32(len(b)))); err != nil {
			return err
		}
		if _, err := wr.Write(b); err != nil {
			return err
		}
		if f, ok := wr.(flusher); ok {
			if err := f.Flush(); err != nil {
				return err
			}
		}
		*comm += time.Since(t0)
	}
	return nil
}

// send queues a tensor; it never blocks (the channel holds a whole
// iteration).
func (s *sender) send(micro int, t *tensor.Tensor) { s.ch <- senderItem{micro, t} }

// finish waits until everything queued is sent and received.
func (s *sender) finish() (time.Duration, error) {
	close(s.ch)
	<-s.done
	return s.comm, s.err
}
