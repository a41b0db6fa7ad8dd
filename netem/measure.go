package netem

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/skyhive/skyhive/stats"
)

// MeasureOptions tunes Measure. Zero fields take the defaults.
type MeasureOptions struct {
	// Pings is the number of one-way latency samples (default 10).
	Pings int
	// PingSize is the size of a latency probe in bytes (default 64).
	PingSize int
	// Warmup is how long bulk data flows before throughput is counted, so
	// that TCP slow start is excluded (default 1 s).
	Warmup time.Duration
	// Duration is the throughput counting window (default 2 s).
	Duration time.Duration
}

func (o MeasureOptions) withDefaults() MeasureOptions {
	if o.Pings <= 0 {
		o.Pings = 10
	}
	if o.PingSize <= 0 {
		o.PingSize = 64
	}
	if o.Warmup <= 0 {
		o.Warmup = time.Second
	}
	if o.Duration <= 0 {
		o.Duration = 2 * time.Second
	}
	return o
}

// Measurement is what Measure observed on the client -> server direction.
type Measurement struct {
	// OneWay is the median one-way latency of a PingSize-byte message:
	// from the client's Write to the server's Read completing, measured on
	// the same clock (one process).
	OneWay time.Duration `json:"one_way_ns"`
	// OneWayMin and OneWayMax show the spread of the samples.
	OneWayMin time.Duration `json:"one_way_min_ns"`
	OneWayMax time.Duration `json:"one_way_max_ns"`
	// RTT is the median time from a probe's Write to the client reading
	// the server's one-byte reply.
	RTT time.Duration `json:"rtt_ns"`
	// Throughput is the bulk goodput in bits per second: application bytes
	// the server read during the counting window, after the warm-up.
	Throughput float64 `json:"throughput_bps"`
}

// String formats m for humans.
func (m Measurement) String() string {
	return fmt.Sprintf("one-way %v (min %v, max %v), rtt %v, throughput %.2f Mbit/s",
		m.OneWay.Round(10*time.Microsecond), m.OneWayMin.Round(10*time.Microsecond),
		m.OneWayMax.Round(10*time.Microsecond), m.RTT.Round(10*time.Microsecond), m.Throughput/1e6)
}

// Measure probes a connection whose two ends live in this process: client
// is the dialing end, server the accepting end. It first sends Pings small
// probes one at a time, each answered by one byte, then streams bulk data
// from client to server for Warmup+Duration and counts what the server reads
// during Duration. Both conns are closed on return.
func Measure(ctx context.Context, client, server net.Conn, o MeasureOptions) (Measurement, error) {
	o = o.withDefaults()
	defer client.Close()
	defer server.Close()
	stop := context.AfterFunc(ctx, func() {
		client.SetDeadline(time.Now())
		server.SetDeadline(time.Now())
	})
	defer stop()

	type result struct {
		arrivals []time.Time
		bytes    int64
		window   time.Duration
		err      error
	}
	res := make(chan result, 1)
	go func() {
		var r result
		r.arrivals, r.bytes, r.window, r.err = measureServer(server, o)
		res <- r
	}()

	var m Measurement
	sent := make([]time.Time, 0, o.Pings)
	rtts := make([]time.Duration, 0, o.Pings)
	probe := make([]byte, o.PingSize)
	ack := make([]byte, 1)
	var clientErr error
	for range o.Pings {
		t0 := time.Now()
		if _, err := client.Write(probe); err != nil {
			clientErr = fmt.Errorf("netem: measure: probe write: %w", err)
			break
		}
		sent = append(sent, t0)
		if _, err := io.ReadFull(client, ack); err != nil {
			clientErr = fmt.Errorf("netem: measure: probe reply: %w", err)
			break
		}
		rtts = append(rtts, time.Since(t0))
	}
	if clientErr == nil {
		// Bulk phase: write until the server has counted its window (it
		// then closes its end and our writes fail) or a deadline passes.
		end := time.Now().Add(o.Warmup + o.Duration + 10*time.Second)
		client.SetWriteDeadline(end)
		buf := make([]byte, 32<<10)
		for time.Now().Before(end) {
			if _, err := client.Write(buf); err != nil {
				break
			}
		}
	}
	client.Close()
	r := <-res
	if clientErr != nil {
		return m, clientErr
	}
	if ctx.Err() != nil {
		return m, fmt.Errorf("netem: measure: %w", ctx.Err())
	}
	if r.err != nil {
		return m, r.err
	}
	oneway := make([]time.Duration, len(sent))
	for i := range sent {
		oneway[i] = r.arrivals[i].Sub(sent[i])
	}
	ow := stats.Summarize(oneway)
	m.OneWay, m.OneWayMin, m.OneWayMax = ow.Median, ow.Min, ow.Max
	m.RTT = stats.Median(rtts)
	m.Throughput = float64(r.bytes) * 8 / r.window.Seconds()
	return m, nil
}

// measureServer answers the probes, then counts bulk bytes during the
// window that starts Warmup after the first bulk byte.
func measureServer(c net.Conn, o MeasureOptions) (arrivals []time.Time, counted int64, window time.Duration, err error) {
	defer c.Close()
	limit := time.Now().Add(time.Duration(o.Pings)*10*time.Second + o.Warmup + o.Duration + 10*time.Second)
	c.SetReadDeadline(limit)
	probe := make([]byte, o.PingSize)
	for range o.Pings {
		if _, err := io.ReadFull(c, probe); err != nil {
			return nil, 0, 0, fmt.Errorf("netem: measure: reading probe: %w", err)
		}
		arrivals = append(arrivals, time.Now())
		if _, err := c.Write(probe[:1]); err != nil {
			return nil, 0, 0, fmt.Errorf("netem: measure: replying to probe: %w", err)
		}
	}
	buf := make([]byte, 64<<10)
	if _, err := c.Read(buf); err != nil {
		return nil, 0, 0, fmt.Errorf("netem: measure: waiting for bulk data: %w", err)
	}
	start := time.Now().Add(o.Warmup)
	end := start.Add(o.Duration)
	c.SetReadDeadline(end)
	for {
		n, err := c.Read(buf)
		now := time.Now()
		if !now.Before(start) {
			counted += int64(n)
		}
		if err != nil {
			if isTimeout(err) {
				break
			}
			return nil, 0, 0, fmt.Errorf("netem: measure: bulk read: %w", err)
		}
	}
	return arrivals, counted, o.Duration, nil
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// MeasureLoopback measures the emulation of a link with params p in mode 1:
// a TCP connection on loopback through a shaping Proxy, both directions set
// to p.
func MeasureLoopback(ctx context.Context, p LinkParams, o MeasureOptions) (Measurement, error) {
	n, a, b, err := twoPeers(p)
	if err != nil {
		return Measurement{}, err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return Measurement{}, fmt.Errorf("netem: measure: %w", err)
	}
	defer ln.Close()
	px, err := n.Proxy(a, b, ln.Addr().String())
	if err != nil {
		return Measurement{}, err
	}
	defer px.Close()
	client, server, err := dialAccept(ctx, ln, func(ctx context.Context) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "tcp", px.Addr())
	})
	if err != nil {
		return Measurement{}, err
	}
	return Measure(ctx, client, server, o)
}

// dialAccept dials with dial and accepts the matching conn on ln.
func dialAccept(ctx context.Context, ln net.Listener, dial func(context.Context) (net.Conn, error)) (client, server net.Conn, err error) {
	type acc struct {
		c   net.Conn
		err error
	}
	ch := make(chan acc, 1)
	go func() {
		c, err := ln.Accept()
		ch <- acc{c, err}
	}()
	dctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	client, err = dial(dctx)
	if err != nil {
		ln.Close() // unblocks Accept
		<-ch
		return nil, nil, fmt.Errorf("netem: measure: dial: %w", err)
	}
	select {
	case a := <-ch:
		if a.err != nil {
			client.Close()
			return nil, nil, fmt.Errorf("netem: measure: accept: %w", a.err)
		}
		return client, a.c, nil
	case <-dctx.Done():
		client.Close()
		ln.Close()
		if a := <-ch; a.c != nil {
			a.c.Close()
		}
		return nil, nil, fmt.Errorf("netem: measure: accept: %w", dctx.Err())
	}
}

// twoPeers returns a network of a client and a server peer joined by links
// with params p in both directions.
func twoPeers(p LinkParams) (n *Network, client, server peer.ID, err error) {
	n, err = New(Uniform(LinkParams{}), 1)
	if err != nil {
		return nil, "", "", err
	}
	client, server = peer.ID("client"), peer.ID("server")
	for _, id := range []peer.ID{client, server} {
		if err := n.Assign(id, "default"); err != nil {
			return nil, "", "", err
		}
	}
	if err := n.SetLink(client, server, p); err != nil {
		return nil, "", "", err
	}
	if err := n.SetLink(server, client, p); err != nil {
		return nil, "", "", err
	}
	return n, client, server, nil
}
