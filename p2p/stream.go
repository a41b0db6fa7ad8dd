package p2p

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/core/protocol"
)

// Chunk framing of streamed calls, in each direction (see docs/p2p.md):
// frames of type byte and length uint32 big-endian, then the payload.
const (
	frameData  = 0 // payload: 1..MaxChunkBytes bytes of the stream
	frameEnd   = 1 // empty: the stream ended normally
	frameError = 2 // payload: an error message of at most 4 KiB
	frameHdr   = 5
)

// ErrProtocol reports a peer that broke the framing.
var ErrProtocol = errors.New("p2p: protocol violation")

// StreamHandler answers one streamed call: it reads the request from r until
// io.EOF and writes the response to w, both chunked by the host. A returned
// error reaches the caller as a *RemoteError, even after part of the
// response was written.
type StreamHandler func(ctx context.Context, from peer.ID, r io.Reader, w io.Writer) error

// ChunkWriter frames what is written to it as data chunks of at most a
// fixed size. Close ends the stream; Abort ends it with an error. Writes of
// at least one chunk go straight through without copying. It is not safe
// for concurrent use.
type ChunkWriter struct {
	w     io.Writer
	chunk int
	buf   []byte // frame under construction: header room, then data
	err   error  // sticky
	n     int64  // payload bytes accepted
}

// NewChunkWriter returns a writer framing onto w in chunks of chunkBytes
// (clamped to 1..MaxChunkBytes).
func NewChunkWriter(w io.Writer, chunkBytes int) *ChunkWriter {
	return &ChunkWriter{w: w, chunk: min(max(chunkBytes, 1), MaxChunkBytes)}
}

var errWriterClosed = errors.New("p2p: write after close")

// Write frames p.
func (c *ChunkWriter) Write(p []byte) (int, error) {
	total := 0
	for len(p) > 0 && c.err == nil {
		if len(c.buf) == 0 && len(p) >= c.chunk {
			var hdr [frameHdr]byte
			putHdr(hdr[:], frameData, c.chunk)
			if _, err := c.w.Write(hdr[:]); err != nil {
				c.err = err
				break
			}
			if _, err := c.w.Write(p[:c.chunk]); err != nil {
				c.err = err
				break
			}
			total += c.chunk
			p = p[c.chunk:]
			continue
		}
		if c.buf == nil {
			c.buf = make([]byte, frameHdr, frameHdr+c.chunk)
		} else if len(c.buf) == 0 {
			c.buf = c.buf[:frameHdr]
		}
		k := copy(c.buf[len(c.buf):cap(c.buf)], p)
		c.buf = c.buf[:len(c.buf)+k]
		total += k
		p = p[k:]
		if len(c.buf) == cap(c.buf) {
			c.flush(nil)
		}
	}
	c.n += int64(total)
	return total, c.err
}

// flush writes the buffered chunk, followed by tail in the same write.
func (c *ChunkWriter) flush(tail []byte) {
	if c.err != nil {
		return
	}
	out := tail
	if len(c.buf) > frameHdr {
		putHdr(c.buf, frameData, len(c.buf)-frameHdr)
		out = append(c.buf, tail...)
	}
	if len(out) > 0 {
		_, c.err = c.w.Write(out)
	}
	if c.buf != nil {
		c.buf = c.buf[:0]
	}
}

// Flush writes any buffered data as a chunk.
func (c *ChunkWriter) Flush() error {
	c.flush(nil)
	return c.err
}

// Close writes buffered data and the end marker. Later writes fail.
func (c *ChunkWriter) Close() error {
	var end [frameHdr]byte
	putHdr(end[:], frameEnd, 0)
	c.flush(end[:])
	err := c.err
	if c.err == nil {
		c.err = errWriterClosed
	}
	return err
}

// Abort discards buffered data and ends the stream with an error frame
// carrying msg (truncated to 4 KiB). Later writes fail.
func (c *ChunkWriter) Abort(msg string) error {
	if c.err != nil {
		return c.err
	}
	msg = truncateMsg(msg)
	frame := make([]byte, frameHdr, frameHdr+len(msg))
	putHdr(frame, frameError, len(msg))
	_, c.err = c.w.Write(append(frame, msg...))
	err := c.err
	if c.err == nil {
		c.err = errWriterClosed
	}
	return err
}

func putHdr(b []byte, typ byte, n int) {
	b[0] = typ
	binary.BigEndian.PutUint32(b[1:frameHdr], uint32(n))
}

// ChunkReader reads a stream framed by a ChunkWriter. Read returns io.EOF
// after the end marker, and a *RemoteError (with Peer and Proto filled in
// from the reader's fields) after an error frame. Chunks over MaxChunkBytes
// and streams over the total limit fail with ErrProtocol and ErrTooLarge.
type ChunkReader struct {
	// Peer and Proto label RemoteErrors.
	Peer  peer.ID
	Proto protocol.ID

	r         io.Reader
	remaining int // bytes left in the current data chunk
	total     int64
	maxTotal  int64
	err       error // sticky
}

// NewChunkReader returns a reader of chunked frames from r accepting at
// most maxTotal payload bytes (no limit if maxTotal <= 0).
func NewChunkReader(r io.Reader, maxTotal int64) *ChunkReader {
	return &ChunkReader{r: r, maxTotal: maxTotal}
}

// Read reads stream payload into p.
func (c *ChunkReader) Read(p []byte) (int, error) {
	if len(p) == 0 {
		return 0, c.err
	}
	for c.remaining == 0 {
		if c.err != nil {
			return 0, c.err
		}
		c.err = c.next()
	}
	n, err := c.r.Read(p[:min(len(p), c.remaining)])
	c.remaining -= n
	if err != nil {
		if c.remaining > 0 || err != io.EOF {
			c.err = unexpectedEOF(err)
			return n, c.err
		}
		err = nil // the chunk is complete; the next frame decides
	}
	return n, err
}

// next reads a frame header; it returns nil when a data chunk starts.
func (c *ChunkReader) next() error {
	var hdr [frameHdr]byte
	if _, err := io.ReadFull(c.r, hdr[:]); err != nil {
		return fmt.Errorf("p2p: read frame: %w", unexpectedEOF(err))
	}
	n := binary.BigEndian.Uint32(hdr[1:])
	switch hdr[0] {
	case frameData:
		if n == 0 || n > MaxChunkBytes {
			return fmt.Errorf("%w: data chunk of %d bytes", ErrProtocol, n)
		}
		c.total += int64(n)
		if c.maxTotal > 0 && c.total > c.maxTotal {
			return fmt.Errorf("p2p: stream over %d bytes: %w", c.maxTotal, ErrTooLarge)
		}
		c.remaining = int(n)
		return nil
	case frameEnd:
		if n != 0 {
			return fmt.Errorf("%w: end frame with %d bytes", ErrProtocol, n)
		}
		return io.EOF
	case frameError:
		if n > maxErrorBytes {
			return fmt.Errorf("%w: error frame of %d bytes", ErrProtocol, n)
		}
		msg := make([]byte, n)
		if _, err := io.ReadFull(c.r, msg); err != nil {
			return fmt.Errorf("p2p: read error frame: %w", unexpectedEOF(err))
		}
		return &RemoteError{Peer: c.Peer, Proto: c.Proto, Msg: strings.ToValidUTF8(string(msg), "?")}
	}
	return fmt.Errorf("%w: frame type %d", ErrProtocol, hdr[0])
}

// SetStreamHandler registers sh for streamed calls on proto, replacing any
// earlier handler. The request reader fails after Config.IdleTimeout without
// data and Config.MaxStreamBytes in total; the response writer fails after
// Config.IdleTimeout without progress. Panics are recovered and reported to
// the caller. After sh returns, unread request data is drained so the caller
// sees a clean end.
func (h *Host) SetStreamHandler(proto protocol.ID, sh StreamHandler) {
	h.h.SetStreamHandler(proto, func(s network.Stream) {
		if !h.track() {
			s.Reset()
			return
		}
		defer h.handlers.Done()
		if !h.gate(s.Conn().RemotePeer()) {
			// Not a member: nothing is read; the caller learns why.
			cw := NewChunkWriter(&idleWriter{s: s, timeout: h.cfg.IdleTimeout}, h.cfg.ChunkBytes)
			if cw.Abort(h.refusal(s.Conn().RemotePeer())) != nil {
				s.Reset()
				return
			}
			s.Close()
			return
		}
		h.serveStream(s, proto, sh)
	})
}

func (h *Host) serveStream(s network.Stream, proto protocol.ID, sh StreamHandler) {
	from := s.Conn().RemotePeer()
	cr := NewChunkReader(&idleReader{s: s, timeout: h.cfg.IdleTimeout}, h.cfg.MaxStreamBytes)
	cr.Peer, cr.Proto = from, proto
	cw := NewChunkWriter(&idleWriter{s: s, timeout: h.cfg.IdleTimeout}, h.cfg.ChunkBytes)
	ctx, cancel := context.WithTimeout(h.ctx, h.cfg.HandlerTimeout)
	var t0 time.Time
	if h.m != nil {
		t0 = time.Now()
	}
	_, err := h.runHandler(ctx, from, proto, func(ctx context.Context) ([]byte, error) {
		return nil, sh(ctx, from, cr, cw)
	})
	cancel()
	if h.m != nil {
		h.m.served(proto, t0, cr.total, cw.n, err)
	}
	if err != nil {
		if cw.Abort(err.Error()) != nil {
			s.Reset()
			return
		}
		s.Close() // graceful: the caller reads the error, then resets
		return
	}
	if cw.Close() != nil {
		s.Reset()
		return
	}
	if err := s.CloseWrite(); err != nil {
		s.Reset()
		return
	}
	if _, err := io.Copy(io.Discard, cr); err != nil {
		s.Reset()
		return
	}
	s.Close()
}

// CallStream makes a streamed call: send writes the request and recv reads
// the response, concurrently, each through the chunk framing, so neither
// side holds a whole large payload in one buffer. send runs in its own
// goroutine and must return once its writes fail; recv runs in the calling
// goroutine. Either may be nil (empty request, discarded response).
//
// ctx's deadline applies to the whole call and ending ctx resets the stream.
// A handler error arrives as a *RemoteError (from recv's reads, or from
// CallStream if recv did not look); an error returned by send or recv is
// returned, wrapped.
func (h *Host) CallStream(ctx context.Context, to peer.AddrInfo, proto protocol.ID, send func(w io.Writer) error, recv func(r io.Reader) error) error {
	if h.m == nil {
		return h.callStream(ctx, to, proto, send, recv, nil)
	}
	t0 := time.Now()
	var n byteTally
	err := h.callStream(ctx, to, proto, send, recv, &n)
	h.m.called(proto, t0, n.sent, n.recv, err)
	return err
}

// callStream is CallStream; n, if set, receives the payload bytes.
func (h *Host) callStream(ctx context.Context, to peer.AddrInfo, proto protocol.ID, send func(w io.Writer) error, recv func(r io.Reader) error, n *byteTally) error {
	s, release, err := h.openStream(ctx, to, proto)
	if err != nil {
		return err
	}
	defer release()
	cr := NewChunkReader(s, h.cfg.MaxStreamBytes)
	cr.Peer, cr.Proto = to.ID, proto
	cw := NewChunkWriter(s, h.cfg.ChunkBytes)
	if n != nil {
		// Every return below follows the send goroutine's end.
		defer func() { n.sent, n.recv = cw.n, cr.total }()
	}

	sendDone := make(chan error, 1)
	go func() { sendDone <- sendSide(s, cw, send) }()

	rerr := recvSide(cr, recv)
	if rerr != nil {
		s.Reset() // unblocks send
	}
	serr := <-sendDone
	var local *callbackError
	switch {
	case errors.As(serr, &local):
		s.Reset()
		return ctxErr(ctx, fmt.Errorf("p2p: stream %s to %s: send: %w", proto, to.ID.ShortString(), local.err))
	case rerr != nil:
		if errors.As(rerr, &local) {
			rerr = local.err
		}
		var re *RemoteError
		if errors.As(rerr, &re) {
			return rerr // the handler's error, possibly wrapped by recv
		}
		return ctxErr(ctx, fmt.Errorf("p2p: stream %s to %s: recv: %w", proto, to.ID.ShortString(), rerr))
	case serr != nil:
		s.Reset()
		return ctxErr(ctx, fmt.Errorf("p2p: stream %s to %s: send: %w", proto, to.ID.ShortString(), serr))
	}
	s.Close()
	return nil
}

// callbackError marks an error returned by (or a panic in) the caller's own
// send or recv function, as opposed to the transport.
type callbackError struct{ err error }

func (e *callbackError) Error() string { return e.err.Error() }
func (e *callbackError) Unwrap() error { return e.err }

func runCallback[T any](f func(T) error, arg T) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = &callbackError{fmt.Errorf("panic: %v", r)}
		}
	}()
	if err := f(arg); err != nil {
		return &callbackError{err}
	}
	return nil
}

func sendSide(s network.Stream, cw *ChunkWriter, send func(io.Writer) error) error {
	if send != nil {
		if err := runCallback(send, io.Writer(cw)); err != nil {
			if cw.err != nil && cw.err != errWriterClosed {
				// The stream broke under send: a transport failure (or the
				// handler gave up, which recv will report), not send's own.
				return cw.err
			}
			cw.Abort("caller failed: " + err.Error())
			s.Reset() // stop the handler and the response at once
			return err
		}
	}
	if err := cw.Close(); err != nil {
		return err
	}
	// The end frame completes the request; the half-close can fail
	// harmlessly once the handler has finished and closed its read side.
	s.CloseWrite()
	return nil
}

func recvSide(cr *ChunkReader, recv func(io.Reader) error) error {
	if recv != nil {
		if err := runCallback(recv, io.Reader(cr)); err != nil {
			var re *RemoteError
			if errors.As(cr.err, &re) && !errors.As(err, &re) {
				// recv failed because the handler did; report the cause
				// even if recv did not wrap it.
				return fmt.Errorf("%w (recv: %v)", cr.err, err)
			}
			return err
		}
	}
	// Consume the rest up to the end marker, to see a late error frame.
	if _, err := io.Copy(io.Discard, cr); err != nil {
		return err
	}
	return nil
}
