package netem

import (
	"context"
	"errors"
	"io"
	"net"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestLoadExampleProfile(t *testing.T) {
	p, err := LoadProfile("../examples/regions.json")
	if err != nil {
		t.Fatal(err)
	}
	l, err := p.Link("us-east", "ap-south")
	if err != nil {
		t.Fatal(err)
	}
	if l.Latency != 95*time.Millisecond || l.Bandwidth != 20e6 || l.Jitter != 5*time.Millisecond || l.Loss != 0.001 {
		t.Fatalf("us-east -> ap-south = %+v", l)
	}
	back, _ := p.Link("ap-south", "us-east")
	if back.Bandwidth != 10e6 {
		t.Fatalf("ap-south -> us-east bandwidth = %v, want asymmetric 10e6", back.Bandwidth)
	}
	intra, _ := p.Link("eu-west", "eu-west")
	if intra.Latency != 500*time.Microsecond || intra.Bandwidth != 1e9 {
		t.Fatalf("intra = %+v", intra)
	}
}

func TestParseProfileErrors(t *testing.T) {
	cases := map[string]struct{ json, want string }{
		"no regions":   {`{"intra":{"latency_ms":1,"bandwidth_mbps":1},"latency_ms":[],"bandwidth_mbps":[]}`, `"regions"`},
		"no intra":     {`{"regions":["a"],"latency_ms":[[0]],"bandwidth_mbps":[[0]]}`, `"intra"`},
		"short matrix": {`{"regions":["a","b"],"intra":{"latency_ms":1,"bandwidth_mbps":1},"latency_ms":[[0,1]],"bandwidth_mbps":[[0,1],[1,0]]}`, `"latency_ms" has 1 rows, want 2`},
		"short row":    {`{"regions":["a","b"],"intra":{"latency_ms":1,"bandwidth_mbps":1},"latency_ms":[[0,1],[1]],"bandwidth_mbps":[[0,1],[1,0]]}`, `row 1 (b) has 1 entries`},
		"negative":     {`{"regions":["a","b"],"intra":{"latency_ms":1,"bandwidth_mbps":1},"latency_ms":[[0,-1],[1,0]],"bandwidth_mbps":[[0,1],[1,0]]}`, `link a -> b: latency`},
		"bad loss":     {`{"regions":["a","b"],"intra":{"latency_ms":1,"bandwidth_mbps":1},"latency_ms":[[0,1],[1,0]],"bandwidth_mbps":[[0,1],[1,0]],"loss":[[0,1],[0,0]]}`, `loss 1 is outside`},
		"duplicate":    {`{"regions":["a","a"],"intra":{"latency_ms":1,"bandwidth_mbps":1},"latency_ms":[[0,1],[1,0]],"bandwidth_mbps":[[0,1],[1,0]]}`, `listed twice`},
		"typo":         {`{"regions":["a"],"intra":{"latency_ms":1,"bandwith_mbps":1},"latency_ms":[[0]],"bandwidth_mbps":[[0]]}`, `unknown field "bandwith_mbps"`},
	}
	for name, c := range cases {
		_, err := ParseProfile([]byte(c.json))
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: err = %v, want it to contain %q", name, err, c.want)
		}
	}
}

func newTestNet(t *testing.T, p LinkParams, ids ...peer.ID) *Network {
	t.Helper()
	n, err := New(Uniform(p), 42)
	if err != nil {
		t.Fatal(err)
	}
	for _, id := range ids {
		if err := n.Assign(id, "default"); err != nil {
			t.Fatal(err)
		}
	}
	return n
}

func TestTransmitSharesBandwidth(t *testing.T) {
	n := newTestNet(t, LinkParams{Latency: 10 * time.Millisecond, Bandwidth: 8e6}, "a", "b", "c")
	// 8 Mbit/s: 1000 bytes take 1 ms to serialize.
	t0 := time.Now()
	first, err := n.Transmit("a", "b", 10000)
	if err != nil {
		t.Fatal(err)
	}
	second, _ := n.Transmit("a", "b", 10000)
	other, _ := n.Transmit("a", "c", 10000)
	near := func(got time.Time, want time.Duration) bool {
		d := got.Sub(t0) - want
		return d > -time.Millisecond && d < 3*time.Millisecond
	}
	if !near(first.Sent, 10*time.Millisecond) || !near(first.Arrive, 20*time.Millisecond) {
		t.Errorf("first: sent %v arrive %v", first.Sent.Sub(t0), first.Arrive.Sub(t0))
	}
	if !near(second.Sent, 20*time.Millisecond) || !near(second.Arrive, 30*time.Millisecond) {
		t.Errorf("second waits for the first: sent %v arrive %v", second.Sent.Sub(t0), second.Arrive.Sub(t0))
	}
	if !near(other.Sent, 10*time.Millisecond) {
		t.Errorf("another link is independent: sent %v", other.Sent.Sub(t0))
	}
}

func TestTransmitDeterministic(t *testing.T) {
	p := LinkParams{Latency: 50 * time.Millisecond, Jitter: 10 * time.Millisecond, Loss: 0.2}
	run := func(seed uint64) (delays []time.Duration, lost []bool) {
		n, _ := New(Uniform(p), seed)
		n.Assign("a", "default")
		n.Assign("b", "default")
		for range 2000 {
			tr, err := n.Transmit("a", "b", 100)
			if err != nil {
				t.Fatal(err)
			}
			delays = append(delays, tr.Arrive.Sub(tr.Sent))
			lost = append(lost, tr.Lost)
		}
		return delays, lost
	}
	_, l1 := run(7)
	_, l2 := run(7)
	_, l3 := run(8)
	same, diff, nlost := true, false, 0
	for i := range l1 {
		same = same && l1[i] == l2[i]
		diff = diff || l1[i] != l3[i]
		if l1[i] {
			nlost++
		}
	}
	if !same || !diff {
		t.Fatalf("loss sequence: same seed equal = %v, other seed differs = %v", same, diff)
	}
	if nlost < 320 || nlost > 480 {
		t.Errorf("lost %d of 2000 at p=0.2", nlost)
	}
	// Jitter stays within ±10 ms (plus FIFO hold-back) and actually varies.
	d, _ := run(7)
	lo, hi := d[0], d[0]
	for _, x := range d {
		lo, hi = min(lo, x), max(hi, x)
	}
	if lo < 40*time.Millisecond || hi > 61*time.Millisecond || hi-lo < 5*time.Millisecond {
		t.Errorf("delays in [%v, %v], want spread inside [40ms, 60ms]", lo, hi)
	}
}

func TestDeliver(t *testing.T) {
	n := newTestNet(t, LinkParams{Latency: 30 * time.Millisecond, Bandwidth: 80e6}, "a", "b", "c")
	ctx := context.Background()
	t0 := time.Now()
	// 100 kB at 80 Mbit/s = 10 ms, then 30 ms latency.
	if err := n.Deliver(ctx, "a", "b", 100000); err != nil {
		t.Fatal(err)
	}
	if d := time.Since(t0); d < 40*time.Millisecond || d > 60*time.Millisecond {
		t.Errorf("Deliver took %v, want about 40ms", d)
	}
	if err := n.Deliver(ctx, "a", "zz", 1); !errors.Is(err, ErrUnknownPeer) {
		t.Errorf("unknown peer: %v", err)
	}
	n.Partition([]peer.ID{"a"}, []peer.ID{"b"})
	if err := n.Deliver(ctx, "a", "b", 1); !errors.Is(err, ErrUnreachable) {
		t.Errorf("partitioned: %v", err)
	}
	if err := n.Deliver(ctx, "a", "c", 1); err != nil {
		t.Errorf("unlisted peer c should be reachable: %v", err)
	}
	n.Heal()
	n.Crash("b")
	if err := n.Deliver(ctx, "c", "b", 1); !errors.Is(err, ErrUnreachable) {
		t.Errorf("crashed: %v", err)
	}
	n.Recover("b")
	n.Block("b", "a")
	if err := n.Deliver(ctx, "a", "b", 1); err != nil {
		t.Errorf("block is directional: %v", err)
	}
	if err := n.Deliver(ctx, "b", "a", 1); !errors.Is(err, ErrUnreachable) {
		t.Errorf("blocked: %v", err)
	}
	// A crash while the message is in flight loses it.
	go func() { time.Sleep(10 * time.Millisecond); n.Crash("c") }()
	if err := n.Deliver(ctx, "a", "c", 1); !errors.Is(err, ErrUnreachable) {
		t.Errorf("crash in flight: %v", err)
	}
	cctx, cancel := context.WithTimeout(ctx, 5*time.Millisecond)
	defer cancel()
	if err := n.Deliver(cctx, "a", "b", 1); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("cancelled: %v", err)
	}
}

func TestDeliverLoss(t *testing.T) {
	n := newTestNet(t, LinkParams{Loss: 0.5}, "a", "b")
	lost := 0
	for range 200 {
		err := n.Deliver(context.Background(), "a", "b", 10)
		if errors.Is(err, ErrLost) {
			lost++
		} else if err != nil {
			t.Fatal(err)
		}
	}
	if lost < 60 || lost > 140 {
		t.Errorf("lost %d of 200 at p=0.5", lost)
	}
}

// echoServer accepts connections and echoes them until closed.
func echoServer(t *testing.T) net.Listener {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer c.Close()
				io.Copy(c, c)
			}()
		}
	}()
	t.Cleanup(func() { ln.Close(); wg.Wait() })
	return ln
}

func TestProxyEchoAndHalfClose(t *testing.T) {
	n := newTestNet(t, LinkParams{Latency: 20 * time.Millisecond, Bandwidth: 100e6}, "a", "b")
	ln := echoServer(t)
	px, err := n.Proxy("a", "b", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer px.Close()
	c, err := net.Dial("tcp", px.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	msg := strings.Repeat("skyhive", 10000) // 70 kB
	t0 := time.Now()
	if _, err := io.WriteString(c, msg); err != nil {
		t.Fatal(err)
	}
	c.(*net.TCPConn).CloseWrite()
	got, err := io.ReadAll(c)
	if err != nil {
		t.Fatal(err)
	}
	if string(got) != msg {
		t.Fatalf("echo returned %d bytes, want %d", len(got), len(msg))
	}
	// 40 ms round trip plus 2 × 5.6 ms serialization.
	if d := time.Since(t0); d < 45*time.Millisecond || d > 200*time.Millisecond {
		t.Errorf("echo through proxy took %v", d)
	}
	n.Partition([]peer.ID{"a"}, []peer.ID{"b"})
	c2, err := net.Dial("tcp", px.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c2.Close()
	c2.SetReadDeadline(time.Now().Add(2 * time.Second))
	if _, err := c2.Read(make([]byte, 1)); err == nil || isTimeout(err) {
		t.Errorf("partitioned proxy: read err = %v, want the connection closed", err)
	}
}

func TestConnPartitionBreaksWrites(t *testing.T) {
	n := newTestNet(t, LinkParams{Latency: time.Millisecond}, "a", "b")
	x, y := net.Pipe()
	defer y.Close()
	go io.Copy(io.Discard, y)
	c := n.Conn(x, "a", "b")
	defer c.Close()
	if _, err := c.Write([]byte("hello")); err != nil {
		t.Fatal(err)
	}
	n.Crash("b")
	if _, err := c.Write([]byte("hello")); !errors.Is(err, ErrUnreachable) {
		t.Fatalf("write across a crash: %v", err)
	}
}

func TestConnWriteDeadline(t *testing.T) {
	n := newTestNet(t, LinkParams{Bandwidth: 80e3}, "a", "b") // 10 kB/s
	x, y := net.Pipe()
	defer y.Close()
	go io.Copy(io.Discard, y)
	c := n.Conn(x, "a", "b")
	defer c.Close()
	c.SetWriteDeadline(time.Now().Add(50 * time.Millisecond))
	t0 := time.Now()
	_, err := c.Write(make([]byte, 100000)) // would take 10 s
	if !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("err = %v, want deadline exceeded", err)
	}
	if d := time.Since(t0); d > time.Second {
		t.Errorf("deadline honoured after %v", d)
	}
}

// TestAccuracyLoopback checks mode 1: a 50 ms, 20 Mbit/s link measured
// with real loopback TCP through the shaping proxy gives a one-way latency
// of 50 ± 5 ms for a 64-byte message and 20 ± 2 Mbit/s bulk goodput.
func TestAccuracyLoopback(t *testing.T) {
	if testing.Short() {
		t.Skip("accuracy measurement takes a few seconds")
	}
	m, err := MeasureLoopback(context.Background(), LinkParams{Latency: 50 * time.Millisecond, Bandwidth: 20e6},
		MeasureOptions{Pings: 10, Warmup: 500 * time.Millisecond, Duration: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("mode 1 (loopback proxy): %v", m)
	checkAccuracy(t, m)
}

func checkAccuracy(t *testing.T, m Measurement) {
	t.Helper()
	if m.OneWay < 45*time.Millisecond || m.OneWay > 55*time.Millisecond {
		t.Errorf("one-way latency %v, want 50 ± 5 ms", m.OneWay)
	}
	if m.RTT < 90*time.Millisecond || m.RTT > 110*time.Millisecond {
		t.Errorf("round trip %v, want 100 ± 10 ms", m.RTT)
	}
	if m.Throughput < 18e6 || m.Throughput > 22e6 {
		t.Errorf("throughput %.2f Mbit/s, want 20 ± 2", m.Throughput/1e6)
	}
}
