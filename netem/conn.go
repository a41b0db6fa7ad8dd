package netem

import (
	"net"
	"os"
	"sync"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/skyhive/skyhive/clock"
)

const (
	// backlogWindow is how far ahead of the link's schedule a writer may
	// run. Letting the writer queue a few milliseconds keeps timer
	// oversleep from eating into the emulated bandwidth.
	backlogWindow = 20 * time.Millisecond
	// maxChunk bounds the bytes sent as one unit on a byte stream.
	maxChunk = 64 << 10
	// minChunk is about one TCP segment.
	minChunk = 1460
	// lineDepth bounds the chunks in flight on one shaped connection.
	lineDepth = 4096
)

// chunkSize picks how many of n pending bytes go out as one unit: about one
// millisecond of link time, between one segment and 64 KiB.
func chunkSize(bandwidth float64, n int) int {
	c := maxChunk
	if bandwidth > 0 {
		c = int(bandwidth / 8 / 1000)
		c = min(max(c, minChunk), maxChunk)
	}
	return min(c, n)
}

type chunk struct {
	data []byte
	at   time.Time
}

// shapedConn shapes the bytes written to it; reads pass through.
type shapedConn struct {
	net.Conn
	n        *Network
	from, to peer.ID

	closing  chan struct{} // closed by Close: abort waiting writers
	abort    chan struct{} // closed when the delay line must stop waiting
	lineDone chan struct{} // closed when the delay line goroutine exits

	wmu    sync.Mutex // serializes Write and the shutdown of q
	q      chan chunk // delay line input; nil once the write side is shut
	lastAt time.Time  // arrival time of the last queued chunk

	dmu       sync.Mutex
	wdeadline time.Time
	dlChanged chan struct{} // closed and replaced when wdeadline changes

	emu sync.Mutex
	err error // first error of the delay line or of the link

	closeOnce  sync.Once
	abortOnce  sync.Once
	closeErr   error
	shutOnce   sync.Once
	shutResult error
}

// Conn wraps c so that every byte written to it crosses the emulated link
// from -> to: writers are held back to the link's bandwidth (sharing it with
// every other transfer on that link) and the bytes reach c after the link's
// latency. Reads are not shaped, so to shape both directions of a
// connection wrap both ends (or use a Proxy, which does).
//
// A byte stream cannot lose bytes; a chunk that the loss model drops is
// delivered one retransmission timeout late instead (max(200 ms, 2 × RTT)),
// holding back the bytes behind it as TCP's in-order delivery does. A
// partition, block or crash on the link breaks the connection at its next
// write: Write returns an error wrapping ErrUnreachable and c is closed.
//
// Close delivers the bytes already written (waiting at most the remaining
// latency plus one second) before closing c. All these times, and the
// write deadline, are read on the network's clock (see WithClock); the
// read deadline is the underlying conn's own. If c has a CloseWrite method,
// the returned conn has one too, with the same draining behaviour.
func (n *Network) Conn(c net.Conn, from, to peer.ID) net.Conn {
	sc := &shapedConn{
		Conn:      c,
		n:         n,
		from:      from,
		to:        to,
		closing:   make(chan struct{}),
		abort:     make(chan struct{}),
		lineDone:  make(chan struct{}),
		q:         make(chan chunk, lineDepth),
		dlChanged: make(chan struct{}),
	}
	go sc.line(sc.q)
	if _, ok := c.(interface{ CloseWrite() error }); ok {
		return &halfCloser{sc}
	}
	return sc
}

// halfCloser exposes CloseWrite when the wrapped conn supports it.
type halfCloser struct{ *shapedConn }

// CloseWrite delivers the bytes already written, then shuts down the
// writing side of the underlying connection.
func (h *halfCloser) CloseWrite() error {
	if err := h.shutdownWrite(); err != nil {
		return err
	}
	return h.Conn.(interface{ CloseWrite() error }).CloseWrite()
}

func (c *shapedConn) lineErr() error {
	c.emu.Lock()
	defer c.emu.Unlock()
	return c.err
}

func (c *shapedConn) setErr(err error) {
	c.emu.Lock()
	defer c.emu.Unlock()
	if c.err == nil {
		c.err = err
	}
}

// line is the delay line: it writes each chunk to the underlying conn at
// its arrival time.
func (c *shapedConn) line(q <-chan chunk) {
	defer close(c.lineDone)
	w := waiter{clk: c.n.clk}
	defer w.stop()
	for ch := range q {
		if c.lineErr() != nil {
			continue // discard what is left
		}
		if !w.until(ch.at, c.abort) {
			c.setErr(net.ErrClosed)
			continue
		}
		if _, err := c.Conn.Write(ch.data); err != nil {
			c.setErr(err)
		}
	}
}

// Write queues b on the emulated link; it blocks while the link's backlog
// exceeds a few milliseconds.
func (c *shapedConn) Write(b []byte) (int, error) {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	if c.q == nil {
		return 0, net.ErrClosed
	}
	written := 0
	for len(b) > 0 {
		if err := c.lineErr(); err != nil {
			return written, err
		}
		p, err := c.n.Params(c.from, c.to)
		if err != nil {
			return written, err
		}
		size := chunkSize(p.Bandwidth, len(b))
		t, err := c.n.Transmit(c.from, c.to, size)
		if err != nil {
			c.setErr(err)
			c.Conn.Close()
			return written, err
		}
		if t.Lost {
			t.Arrive = t.Arrive.Add(c.n.retransmitPenalty(c.from, c.to))
		}
		if err := c.waitUntil(t.Sent.Add(-backlogWindow)); err != nil {
			return written, err
		}
		data := make([]byte, size)
		copy(data, b)
		select {
		case c.q <- chunk{data: data, at: t.Arrive}:
		case <-c.closing:
			return written, net.ErrClosed
		}
		c.lastAt = t.Arrive
		written += size
		b = b[size:]
	}
	return written, nil
}

// waitUntil blocks until t, honouring Close and the write deadline.
func (c *shapedConn) waitUntil(t time.Time) error {
	clk := c.n.clk
	if t.Sub(clk.Now()) <= 0 {
		return nil
	}
	timer := clk.NewTimer(t.Sub(clk.Now()))
	defer timer.Stop()
	for {
		c.dmu.Lock()
		dl, changed := c.wdeadline, c.dlChanged
		c.dmu.Unlock()
		var deadline <-chan time.Time
		var dt clock.Timer
		if !dl.IsZero() {
			if dl.Sub(clk.Now()) <= 0 {
				return os.ErrDeadlineExceeded
			}
			dt = clk.NewTimer(dl.Sub(clk.Now()))
			deadline = dt.C()
		}
		var err error
		done := true
		select {
		case <-timer.C():
		case <-deadline:
			err = os.ErrDeadlineExceeded
		case <-changed:
			done = false
		case <-c.closing:
			err = net.ErrClosed
		}
		if dt != nil {
			dt.Stop()
		}
		if done {
			return err
		}
	}
}

// SetWriteDeadline bounds how long Write waits for the emulated link. It
// may be called while a Write is blocked.
func (c *shapedConn) SetWriteDeadline(t time.Time) error {
	c.dmu.Lock()
	defer c.dmu.Unlock()
	c.wdeadline = t
	close(c.dlChanged)
	c.dlChanged = make(chan struct{})
	return nil
}

// SetDeadline sets the read deadline of the underlying conn and the write
// deadline of the emulated link.
func (c *shapedConn) SetDeadline(t time.Time) error {
	if err := c.Conn.SetReadDeadline(t); err != nil {
		return err
	}
	return c.SetWriteDeadline(t)
}

// shutdownWrite stops accepting writes and waits until the delay line has
// delivered what was queued (bounded by the remaining latency plus 1 s).
func (c *shapedConn) shutdownWrite() error {
	c.shutOnce.Do(func() {
		c.wmu.Lock()
		if c.q != nil {
			close(c.q)
			c.q = nil
		}
		clk := c.n.clk
		wait := c.lastAt.Sub(clk.Now()) + time.Second
		c.wmu.Unlock()
		timer := clk.NewTimer(max(wait, time.Second))
		defer timer.Stop()
		select {
		case <-c.lineDone:
		case <-timer.C():
			c.stopLine()
			c.shutResult = net.ErrClosed
		}
		if err := c.lineErr(); err != nil && c.shutResult == nil {
			c.shutResult = err
		}
	})
	return c.shutResult
}

// stopLine makes the delay line give up and waits for it.
func (c *shapedConn) stopLine() {
	c.abortOnce.Do(func() { close(c.abort) })
	// A write blocked on the underlying conn returns once it is closed.
	c.Conn.SetWriteDeadline(time.Now())
	<-c.lineDone
}

// Close delivers the bytes already written, then closes the underlying conn.
func (c *shapedConn) Close() error {
	c.closeOnce.Do(func() {
		close(c.closing)
		c.shutdownWrite()
		c.stopLine()
		c.closeErr = c.Conn.Close()
	})
	return c.closeErr
}

// waiter waits for arrival times on one reusable timer of clk, made on
// first use so that an idle delay line arms none.
type waiter struct {
	clk   clock.Clock
	timer clock.Timer
}

// until waits until at; it reports false if abort closed first.
func (w *waiter) until(at time.Time, abort <-chan struct{}) bool {
	d := at.Sub(w.clk.Now())
	if d <= 0 {
		return true
	}
	if w.timer == nil {
		w.timer = w.clk.NewTimer(d)
	} else {
		w.timer.Reset(d)
	}
	select {
	case <-w.timer.C():
		return true
	case <-abort:
		return false
	}
}

// stop releases the timer.
func (w *waiter) stop() {
	if w.timer != nil {
		w.timer.Stop()
	}
}
