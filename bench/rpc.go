package bench

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/skyhive/skyhive/p2p"
	"github.com/skyhive/skyhive/tensor"
	"github.com/skyhive/skyhive/wire"
)

// rpcSuite measures tensor RPC over p2p hosts on loopback (TCP+TLS+yamux,
// and QUIC) against raw TCP sockets carrying the same framing and the same
// wire-encoded payload, alternating A B A B in one run.
func rpcSuite() Suite {
	return Suite{
		Name:  "rpc",
		Short: "64 B round-trip latency and tensor stream MB/s over p2p (TCP+TLS, QUIC) vs raw TCP",
		Run:   runRPC,
	}
}

const (
	rpcEcho   = "/skyhive/bench/echo/1.0.0"
	rpcTensor = "/skyhive/bench/tensor/1.0.0"
)

func runRPC(ctx context.Context, o Options) ([]Result, error) {
	reps := max(o.Reps, 5)
	sizes := []int{4 << 20, 16 << 20, 64 << 20}
	calls := 300 // round trips per latency measurement
	if o.Quick {
		sizes = []int{4 << 20, 16 << 20}
		calls = 100
	}
	raw, err := newRawServer()
	if err != nil {
		return nil, err
	}
	defer raw.close()
	rc, err := raw.dial()
	if err != nil {
		return nil, err
	}
	defer rc.Close()

	var out []Result
	for _, transport := range []string{"tcp", "quic"} {
		rs, err := rpcTransport(ctx, o, transport, reps, calls, sizes, rc)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", transport, err)
		}
		out = append(out, rs...)
	}
	return out, nil
}

func rpcTransport(ctx context.Context, o Options, transport string, reps, calls int, sizes []int, rc net.Conn) ([]Result, error) {
	listen := "/ip4/127.0.0.1/tcp/0"
	label := "tcp+tls"
	if transport == "quic" {
		listen = "/ip4/127.0.0.1/udp/0/quic-v1"
		label = "quic"
	}
	reg := o.registerer()
	a, err := p2p.New(ctx, p2p.Config{ListenAddrs: []string{listen}, Metrics: reg})
	if err != nil {
		return nil, err
	}
	defer a.Close()
	b, err := p2p.New(ctx, p2p.Config{ListenAddrs: []string{listen}, Metrics: reg})
	if err != nil {
		return nil, err
	}
	defer b.Close()
	setRPCHandlers(b)
	r := &rpcRun{o: o, ctx: ctx, label: label, a: a, to: b.AddrInfo(), rc: rc, reps: reps, calls: calls}

	var out []Result
	res, err := r.latency()
	if err != nil {
		return nil, err
	}
	out = append(out, res)
	for _, size := range sizes {
		res, err := r.throughput(size)
		if err != nil {
			return nil, err
		}
		out = append(out, res)
	}
	if n := a.NumConns(b.ID()); n != 1 {
		return nil, fmt.Errorf("%d connections after the benchmark, want 1", n)
	}
	return out, nil
}

// setRPCHandlers makes b echo rpcEcho requests and decode rpcTensor
// streams, answering with an ack.
func setRPCHandlers(b *p2p.Host) {
	b.SetHandler(rpcEcho, func(_ context.Context, _ peer.ID, req []byte) ([]byte, error) { return req, nil })
	b.SetStreamHandler(rpcTensor, func(_ context.Context, _ peer.ID, r io.Reader, w io.Writer) error {
		t, err := wire.Decode(r, wire.Limits{})
		if err != nil {
			return err
		}
		return writeAck(w, len(t.Data))
	})
}

// rpcRun measures one transport: calls from a to the peer to against
// the same exchange on the raw TCP connection rc.
type rpcRun struct {
	o           Options
	ctx         context.Context
	label       string
	a           *p2p.Host
	to          peer.AddrInfo
	rc          net.Conn
	reps, calls int
	failure     error // the first error of a timed call
}

// fail records err if it is the first.
func (r *rpcRun) fail(err error) {
	if err != nil && r.failure == nil {
		r.failure = err
	}
}

// latency times 64-byte requests with 64-byte responses.
func (r *rpcRun) latency() (Result, error) {
	req := make([]byte, 64)
	p2pLat := func() {
		for range r.calls {
			_, err := r.a.Call(r.ctx, r.to, rpcEcho, req)
			r.fail(err)
		}
	}
	rawLat := func() {
		for range r.calls {
			r.fail(rawCall(r.rc, req))
		}
	}
	r.o.Logf("rpc: %s latency, %d reps of %d calls", r.label, r.reps, r.calls)
	ta, tb, err := TimeAlternating(r.ctx, r.reps, 1, p2pLat, rawLat)
	if err != nil {
		return Result{}, err
	}
	if r.failure != nil {
		return Result{}, r.failure
	}
	perCall := func(xs []float64) []float64 {
		us := make([]float64, len(xs))
		for i, x := range xs {
			us[i] = x / float64(r.calls) * 1e6
		}
		return us
	}
	sa, sb := Summarize(perCall(ta)), Summarize(perCall(tb))
	return Result{
		Suite: "rpc", Case: "rtt_64B/" + r.label, Metric: "latency", Value: sa.Median, Unit: "µs",
		Min: sa.Min, Max: sa.Max, Note: "new stream per call on a reused connection",
	}.WithBaseline("raw_tcp", sb.Median), nil
}

// throughput times one float32 tensor of size bytes streamed with the
// chunk framing and decoded on the far side, which answers with a small
// ack.
func (r *rpcRun) throughput(size int) (Result, error) {
	x := tensor.New(size / 4)
	for i := range x.Data {
		x.Data[i] = float32(i)
	}
	p2pSend := func() {
		r.fail(r.a.CallStream(r.ctx, r.to, rpcTensor, func(w io.Writer) error {
			return wire.Encode(w, x, wire.Options{})
		}, func(rd io.Reader) error {
			return readAck(rd, len(x.Data))
		}))
	}
	rawSend := func() { r.fail(rawStream(r.rc, x)) }
	r.o.Logf("rpc: %s stream %d MiB, %d reps", r.label, size>>20, r.reps)
	ta, tb, err := TimeAlternating(r.ctx, r.reps, 1, p2pSend, rawSend)
	if err != nil {
		return Result{}, err
	}
	if r.failure != nil {
		return Result{}, r.failure
	}
	mbps := func(xs []float64) []float64 {
		res := make([]float64, len(xs))
		for i, s := range xs {
			res[i] = float64(size) / s / 1e6
		}
		return res
	}
	sa, sb := Summarize(mbps(ta)), Summarize(mbps(tb))
	return Result{
		Suite: "rpc", Case: fmt.Sprintf("stream_%dMiB/%s", size>>20, r.label), Metric: "throughput",
		Value: sa.Median, Unit: "MB/s", Min: sa.Min, Max: sa.Max,
	}.WithBaseline("raw_tcp", sb.Median), nil
}

func writeAck(w io.Writer, n int) error {
	var b [8]byte
	binary.BigEndian.PutUint64(b[:], uint64(n))
	_, err := w.Write(b[:])
	return err
}

func readAck(r io.Reader, want int) error {
	var b [8]byte
	if _, err := io.ReadFull(r, b[:]); err != nil {
		return err
	}
	if got := binary.BigEndian.Uint64(b[:]); got != uint64(want) {
		return fmt.Errorf("ack for %d elements, sent %d", got, want)
	}
	return nil
}

// rawServer is the baseline: plain TCP on loopback, one goroutine per
// connection, serving the same two exchanges as the p2p handlers. The first
// byte of each exchange says which: 'c' a call, 's' a stream.
type rawServer struct {
	ln net.Listener
	wg sync.WaitGroup

	mu    sync.Mutex
	conns []net.Conn
}

func newRawServer() (*rawServer, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("raw tcp: %w", err)
	}
	s := &rawServer{ln: ln}
	s.wg.Add(1)
	go s.accept()
	return s, nil
}

func (s *rawServer) dial() (net.Conn, error) {
	c, err := net.Dial("tcp", s.ln.Addr().String())
	if err != nil {
		return nil, fmt.Errorf("raw tcp: %w", err)
	}
	return c, nil
}

func (s *rawServer) accept() {
	defer s.wg.Done()
	for {
		c, err := s.ln.Accept()
		if err != nil {
			return
		}
		s.mu.Lock()
		s.conns = append(s.conns, c)
		s.mu.Unlock()
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			defer c.Close()
			for s.serve(c) == nil {
			}
		}()
	}
}

func (s *rawServer) serve(c net.Conn) error {
	var kind [1]byte
	if _, err := io.ReadFull(c, kind[:]); err != nil {
		return err
	}
	switch kind[0] {
	case 'c':
		var hdr [4]byte
		if _, err := io.ReadFull(c, hdr[:]); err != nil {
			return err
		}
		n := binary.BigEndian.Uint32(hdr[:])
		if n > p2p.DefaultMaxMessageBytes {
			return errors.New("raw tcp: request too large")
		}
		resp := make([]byte, 5+n)
		if _, err := io.ReadFull(c, resp[5:]); err != nil {
			return err
		}
		binary.BigEndian.PutUint32(resp[1:5], n)
		_, err := c.Write(resp)
		return err
	case 's':
		cr := p2p.NewChunkReader(c, p2p.DefaultMaxStreamBytes)
		t, err := wire.Decode(cr, wire.Limits{})
		if err != nil {
			return err
		}
		if _, err := io.Copy(io.Discard, cr); err != nil {
			return err
		}
		cw := p2p.NewChunkWriter(c, p2p.DefaultChunkBytes)
		if err := writeAck(cw, len(t.Data)); err != nil {
			return err
		}
		return cw.Close()
	}
	return fmt.Errorf("raw tcp: unknown exchange %q", kind[0])
}

func (s *rawServer) close() {
	s.ln.Close()
	s.mu.Lock()
	for _, c := range s.conns {
		c.Close()
	}
	s.mu.Unlock()
	s.wg.Wait()
}

// rawCall is Call's framing on a plain socket: length-prefixed request in
// one write, status and length-prefixed response.
func rawCall(c net.Conn, req []byte) error {
	c.SetDeadline(time.Now().Add(time.Minute))
	msg := make([]byte, 5+len(req))
	msg[0] = 'c'
	binary.BigEndian.PutUint32(msg[1:5], uint32(len(req)))
	copy(msg[5:], req)
	if _, err := c.Write(msg); err != nil {
		return err
	}
	var hdr [5]byte
	if _, err := io.ReadFull(c, hdr[:]); err != nil {
		return err
	}
	n := binary.BigEndian.Uint32(hdr[1:])
	if hdr[0] != 0 || int(n) != len(req) {
		return fmt.Errorf("raw tcp: response status %d with %d bytes", hdr[0], n)
	}
	_, err := io.ReadFull(c, make([]byte, n))
	return err
}

// rawStream is CallStream's framing on a plain socket.
func rawStream(c net.Conn, x *tensor.Tensor) error {
	c.SetDeadline(time.Now().Add(time.Minute))
	if _, err := c.Write([]byte{'s'}); err != nil {
		return err
	}
	cw := p2p.NewChunkWriter(c, p2p.DefaultChunkBytes)
	if err := wire.Encode(cw, x, wire.Options{}); err != nil {
		return err
	}
	if err := cw.Close(); err != nil {
		return err
	}
	cr := p2p.NewChunkReader(c, 1<<10)
	if err := readAck(cr, len(x.Data)); err != nil {
		return err
	}
	_, err := io.Copy(io.Discard, cr)
	return err
}
