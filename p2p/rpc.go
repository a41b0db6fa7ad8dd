package p2p

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"runtime/debug"
	"strings"
	"time"

	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/core/protocol"
)

// Call framing (see docs/p2p.md):
//
//	request:  length uint32 big-endian, payload; then the caller closes its
//	          write side
//	response: status byte (0 ok, 1 error), length uint32 big-endian, payload
//	          (the response, or the handler's error message)
const (
	statusOK    = 0
	statusError = 1
	// asyncWriteBytes: requests larger than this are written concurrently
	// with reading the response, so a server that rejects a request early
	// is heard instead of blocking the writer on flow control.
	asyncWriteBytes = 64 << 10
	// ioPiece bounds one write, so idle deadlines are refreshed regularly.
	ioPiece = 1 << 20
	// firstBuffer is what a reader allocates before data arrives; buffers
	// grow 4x as it does, so a peer's length prefix alone costs little.
	firstBuffer = 256 << 10
)

// ErrTooLarge reports a message over the configured size limit.
var ErrTooLarge = errors.New("p2p: message too large")

// SetHandler registers hd for proto, replacing any earlier handler. Each
// request runs hd in its own goroutine with a ctx that ends after
// Config.HandlerTimeout or when the host closes. Panics in hd are recovered
// and reported to the caller as errors.
func (h *Host) SetHandler(proto protocol.ID, hd Handler) {
	h.h.SetStreamHandler(proto, func(s network.Stream) {
		if !h.trackAs(true) {
			s.Reset()
			return
		}
		defer h.handlers.Done()
		defer h.serving.Done()
		if !h.gate(s.Conn().RemotePeer()) {
			// Not a member: nothing is read; the caller learns why.
			replyError(s, &idleWriter{s: s, timeout: h.cfg.IdleTimeout}, h.refusal(s.Conn().RemotePeer()))
			return
		}
		h.serveCall(s, proto, hd)
	})
}

// RemoveHandler unregisters the handler for proto (call or stream).
func (h *Host) RemoveHandler(proto protocol.ID) { h.h.RemoveStreamHandler(proto) }

func (h *Host) serveCall(s network.Stream, proto protocol.ID, hd Handler) {
	from := s.Conn().RemotePeer()
	rd := &idleReader{s: s, timeout: h.cfg.IdleTimeout}
	wr := &idleWriter{s: s, timeout: h.cfg.IdleTimeout}
	var hdr [4]byte
	if _, err := io.ReadFull(rd, hdr[:]); err != nil {
		s.Reset()
		return
	}
	n := binary.BigEndian.Uint32(hdr[:])
	if uint64(n) > uint64(h.cfg.MaxMessageBytes) {
		h.warnPeer("p2p: request too large", "proto", proto, "peer", from, "bytes", n)
		replyError(s, wr, fmt.Sprintf("request of %d bytes exceeds the limit of %d", n, h.cfg.MaxMessageBytes))
		return
	}
	release, err := h.reserveRequest(from, int64(n))
	if err != nil {
		replyError(s, wr, err.Error())
		return
	}
	defer release()
	arrived, err := h.enterRead(s, proto)
	if err != nil {
		replyError(s, wr, err.Error())
		return
	}
	// After the first IdleTimeout the request must keep arriving at
	// MinRequestRate at least, whatever size it announced: a sender
	// trickling bytes just inside the idle timeout is cut within about
	// IdleTimeout, and cannot hold the handler and its buffer for long.
	rd.floor, rd.start = h.cfg.MinRequestRate, time.Now()
	req, err := readN(rd, int(n))
	arrived()
	if err != nil {
		s.Reset()
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			h.noteSlow(from, proto)
		}
		return
	}
	ctx, cancel := context.WithTimeout(h.ctx, h.cfg.HandlerTimeout)
	var t0 time.Time
	if h.m != nil {
		t0 = time.Now()
	}
	resp, err := h.runHandler(ctx, from, proto, func(ctx context.Context) ([]byte, error) { return hd(ctx, from, req) })
	cancel()
	if h.m != nil {
		h.m.served(proto, t0, int64(len(req)), int64(len(resp)), err)
	}
	if err != nil {
		replyError(s, wr, err.Error())
		return
	}
	if len(resp) > h.cfg.MaxMessageBytes {
		replyError(s, wr, fmt.Sprintf("response of %d bytes exceeds the limit of %d", len(resp), h.cfg.MaxMessageBytes))
		return
	}
	if err := writeFrame(wr, statusOK, resp); err != nil {
		s.Reset()
		return
	}
	if len(resp) >= lingerBytes {
		h.answered.Store(time.Now().UnixNano())
	}
	s.Close()
}

// runHandler calls f, turning a panic into an error.
func (h *Host) runHandler(ctx context.Context, from peer.ID, proto protocol.ID, f func(context.Context) ([]byte, error)) (resp []byte, err error) {
	defer func() {
		if r := recover(); r != nil {
			h.log.Error("p2p: handler panicked", "proto", proto, "peer", from, "panic", r, "stack", string(debug.Stack()))
			err = fmt.Errorf("handler panicked: %v", r)
		}
	}()
	return f(ctx)
}

// replyError sends an error response and closes the stream gracefully, so
// the message arrives even if the caller is still writing.
func replyError(s network.Stream, w io.Writer, msg string) {
	if err := writeFrame(w, statusError, []byte(truncateMsg(msg))); err != nil {
		s.Reset()
		return
	}
	s.Close()
}

func truncateMsg(msg string) string {
	if len(msg) > maxErrorBytes {
		msg = msg[:maxErrorBytes]
	}
	return strings.ToValidUTF8(msg, "?")
}

// writeFrame writes a response frame, in one write when it is small.
func writeFrame(w io.Writer, status byte, payload []byte) error {
	var hdr [5]byte
	hdr[0] = status
	binary.BigEndian.PutUint32(hdr[1:], uint32(len(payload)))
	if len(payload) <= asyncWriteBytes {
		_, err := w.Write(append(hdr[:], payload...))
		return err
	}
	if _, err := w.Write(hdr[:]); err != nil {
		return err
	}
	_, err := w.Write(payload)
	return err
}

// writeRequest writes a length-prefixed request, in one write when small.
func writeRequest(w io.Writer, req []byte) error {
	var hdr [4]byte
	binary.BigEndian.PutUint32(hdr[:], uint32(len(req)))
	if len(req) <= asyncWriteBytes {
		_, err := w.Write(append(hdr[:], req...))
		return err
	}
	if _, err := w.Write(hdr[:]); err != nil {
		return err
	}
	_, err := w.Write(req)
	return err
}

// readN reads exactly n bytes, growing its buffer as data arrives.
func readN(r io.Reader, n int) ([]byte, error) {
	buf := make([]byte, 0, min(n, firstBuffer))
	for len(buf) < n {
		if len(buf) == cap(buf) {
			nb := make([]byte, len(buf), min(4*cap(buf), n))
			copy(nb, buf)
			buf = nb
		}
		k, err := r.Read(buf[len(buf):cap(buf)])
		buf = buf[:len(buf)+k]
		if err != nil && len(buf) < n {
			if err == io.EOF {
				err = io.ErrUnexpectedEOF
			}
			return nil, err
		}
	}
	return buf, nil
}

// Call sends req to the peer over proto and returns the response. It adds
// to.Addrs to the peerstore and reuses an existing connection if there is
// one. ctx's deadline applies to the whole exchange, and ending ctx resets
// the stream. A handler error arrives as a *RemoteError; a request or
// response over Config.MaxMessageBytes fails with ErrTooLarge (or, when the
// remote limit is smaller, a *RemoteError saying so).
func (h *Host) Call(ctx context.Context, to peer.AddrInfo, proto protocol.ID, req []byte) ([]byte, error) {
	if h.m == nil {
		return h.call(ctx, to, proto, req)
	}
	t0 := time.Now()
	resp, err := h.call(ctx, to, proto, req)
	h.m.called(proto, t0, int64(len(req)), int64(len(resp)), err)
	return resp, err
}

func (h *Host) call(ctx context.Context, to peer.AddrInfo, proto protocol.ID, req []byte) ([]byte, error) {
	if len(req) > h.cfg.MaxMessageBytes {
		return nil, fmt.Errorf("p2p: call %s: request of %d bytes over %d: %w", proto, len(req), h.cfg.MaxMessageBytes, ErrTooLarge)
	}
	s, release, err := h.openStream(ctx, to, proto)
	if err != nil {
		return nil, err
	}
	defer release()
	resp, err := h.exchange(s, to.ID, proto, req)
	if err != nil {
		s.Reset()
		var re *RemoteError
		if errors.As(err, &re) {
			return nil, re
		}
		return nil, ctxErr(ctx, fmt.Errorf("p2p: call %s on %s: %w", proto, to.ID.ShortString(), err))
	}
	s.Close()
	return resp, nil
}

func (h *Host) exchange(s network.Stream, to peer.ID, proto protocol.ID, req []byte) ([]byte, error) {
	write := func() error {
		if err := writeRequest(s, req); err != nil {
			return err
		}
		// The length prefix delimits the request; the half-close is a
		// courtesy. It can fail harmlessly when the handler has already
		// answered and closed its read side (QUIC's STOP_SENDING).
		if err := s.CloseWrite(); err != nil {
			h.log.Debug("p2p: close write", "proto", proto, "err", err)
		}
		return nil
	}
	var writeDone chan error
	if len(req) <= asyncWriteBytes {
		if err := write(); err != nil {
			// The handler may have rejected the request already; its
			// answer explains more than the write error.
			if _, rerr := h.readResponse(s, to, proto); rerr != nil {
				var re *RemoteError
				if errors.As(rerr, &re) {
					return nil, re
				}
			}
			return nil, err
		}
	} else {
		writeDone = make(chan error, 1)
		go func() { writeDone <- write() }()
	}
	resp, rerr := h.readResponse(s, to, proto)
	if writeDone != nil {
		if rerr != nil {
			s.Reset() // unblocks the writer
		}
		if werr := <-writeDone; werr != nil && rerr == nil {
			// The server answered, so it read the whole request; a failure
			// closing our side afterwards does not change the answer.
			h.log.Debug("p2p: write after response", "proto", proto, "err", werr)
		}
	}
	return resp, rerr
}

func (h *Host) readResponse(r io.Reader, to peer.ID, proto protocol.ID) ([]byte, error) {
	var hdr [5]byte
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		return nil, fmt.Errorf("read response: %w", unexpectedEOF(err))
	}
	n := binary.BigEndian.Uint32(hdr[1:])
	switch hdr[0] {
	case statusOK:
		if uint64(n) > uint64(h.cfg.MaxMessageBytes) {
			return nil, fmt.Errorf("response of %d bytes over %d: %w", n, h.cfg.MaxMessageBytes, ErrTooLarge)
		}
		resp, err := readN(r, int(n))
		if err != nil {
			return nil, fmt.Errorf("read response: %w", err)
		}
		return resp, nil
	case statusError:
		if n > maxErrorBytes {
			return nil, fmt.Errorf("error message of %d bytes over %d: %w", n, maxErrorBytes, ErrTooLarge)
		}
		msg, err := readN(r, int(n))
		if err != nil {
			return nil, fmt.Errorf("read error response: %w", err)
		}
		return nil, &RemoteError{Peer: to, Proto: proto, Msg: strings.ToValidUTF8(string(msg), "?")}
	}
	return nil, fmt.Errorf("bad response status %d", hdr[0])
}

func unexpectedEOF(err error) error {
	if err == io.EOF {
		return io.ErrUnexpectedEOF
	}
	return err
}

// idleReader refreshes the stream's read deadline before every read, so a
// peer that stops sending is cut off after timeout.
type idleReader struct {
	s       network.Stream
	timeout time.Duration
	// floor, if set, is the rate in bytes per second the data must keep
	// up with from start on, after a first timeout: no read goes past
	// start + timeout + got/floor.
	floor int
	start time.Time
	got   int64
}

func (r *idleReader) Read(p []byte) (int, error) {
	dl := time.Now().Add(r.timeout)
	if r.floor > 0 {
		due := r.start.Add(r.timeout + time.Duration(float64(r.got)/float64(r.floor)*float64(time.Second)))
		dl = minTime(dl, due)
	}
	if err := r.s.SetReadDeadline(dl); err != nil {
		return 0, err
	}
	n, err := r.s.Read(p)
	r.got += int64(n)
	return n, err
}

func minTime(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}

// idleWriter writes in pieces, refreshing the write deadline before each,
// so a peer that stops reading is cut off after timeout.
type idleWriter struct {
	s       network.Stream
	timeout time.Duration
}

func (w *idleWriter) Write(p []byte) (int, error) {
	total := 0
	for len(p) > 0 {
		if err := w.s.SetWriteDeadline(time.Now().Add(w.timeout)); err != nil {
			return total, err
		}
		k := min(len(p), ioPiece)
		n, err := w.s.Write(p[:k])
		total += n
		if err != nil {
			return total, err
		}
		p = p[k:]
	}
	return total, nil
}
