package p2p

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/core/protocol"
	ma "github.com/multiformats/go-multiaddr"
	"go.uber.org/goleak"

	"github.com/skyhive/skyhive/tensor"
	"github.com/skyhive/skyhive/wire"
)

func TestMain(m *testing.M) {
	// No exceptions: a closed Host leaves no goroutines behind.
	goleak.VerifyTestMain(m)
}

var transports = []string{"tcp", "quic"}

func listenAddr(transport string) string {
	if transport == "quic" {
		return "/ip4/127.0.0.1/udp/0/quic-v1"
	}
	return "/ip4/127.0.0.1/tcp/0"
}

func newHost(t testing.TB, transport string, cfg Config) *Host {
	t.Helper()
	cfg.ListenAddrs = []string{listenAddr(transport)}
	h, err := New(context.Background(), cfg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(func() {
		if err := h.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return h
}

const (
	echoProto  protocol.ID = "/skyhive/test/echo/1.0.0"
	failProto  protocol.ID = "/skyhive/test/fail/1.0.0"
	panicProto protocol.ID = "/skyhive/test/panic/1.0.0"
	slowProto  protocol.ID = "/skyhive/test/slow/1.0.0"
	bigProto   protocol.ID = "/skyhive/test/big/1.0.0"
)

func echo(_ context.Context, _ peer.ID, req []byte) ([]byte, error) { return req, nil }

func pair(t testing.TB, transport string, client, server Config) (*Host, *Host) {
	a := newHost(t, transport, client)
	b := newHost(t, transport, server)
	b.SetHandler(echoProto, echo)
	return a, b
}

func ctxT(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

func TestCallAndConnectionReuse(t *testing.T) {
	for _, tr := range transports {
		t.Run(tr, func(t *testing.T) {
			a, b := pair(t, tr, Config{}, Config{})
			ctx := ctxT(t, 20*time.Second)
			var wg sync.WaitGroup
			errs := make(chan error, 100)
			for i := range 100 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					req := []byte(fmt.Sprintf("hello %d", i))
					resp, err := a.Call(ctx, b.AddrInfo(), echoProto, req)
					if err == nil && !bytes.Equal(resp, req) {
						err = fmt.Errorf("response %q for %q", resp, req)
					}
					errs <- err
				}()
				if i%10 == 9 {
					wg.Wait() // some sequential, some concurrent
				}
			}
			wg.Wait()
			close(errs)
			for err := range errs {
				if err != nil {
					t.Fatal(err)
				}
			}
			if n := a.NumConns(b.ID()); n != 1 {
				t.Fatalf("%d connections after 100 calls, want 1", n)
			}
			// Empty request and the reverse direction on the same connection.
			a.SetHandler(echoProto, echo)
			if resp, err := b.Call(ctx, peer.AddrInfo{ID: a.ID()}, echoProto, nil); err != nil || len(resp) != 0 {
				t.Fatalf("reverse empty call: %q, %v", resp, err)
			}
			if n := b.NumConns(a.ID()); n != 1 {
				t.Fatalf("%d connections after reverse call", n)
			}
		})
	}
}

func TestRemoteErrorAndPanic(t *testing.T) {
	a, b := pair(t, "tcp", Config{}, Config{})
	b.SetHandler(failProto, func(_ context.Context, from peer.ID, _ []byte) ([]byte, error) {
		return nil, fmt.Errorf("no expert for %s", from.ShortString())
	})
	b.SetHandler(panicProto, func(context.Context, peer.ID, []byte) ([]byte, error) {
		var experts []int
		return []byte{byte(experts[len(experts)-1])}, nil // index out of range
	})
	ctx := ctxT(t, 10*time.Second)
	_, err := a.Call(ctx, b.AddrInfo(), failProto, []byte("x"))
	var re *RemoteError
	if !errors.As(err, &re) {
		t.Fatalf("err %v (%T), want *RemoteError", err, err)
	}
	if re.Msg != "no expert for "+a.ID().ShortString() || re.Peer != b.ID() || re.Proto != failProto {
		t.Fatalf("remote error %+v", re)
	}
	_, err = a.Call(ctx, b.AddrInfo(), panicProto, nil)
	if !errors.As(err, &re) || !strings.Contains(re.Msg, "panicked") {
		t.Fatalf("panic: err %v", err)
	}
	if _, err := a.Call(ctx, b.AddrInfo(), echoProto, []byte("still up")); err != nil {
		t.Fatalf("after panic: %v", err)
	}
	if _, err := a.Call(ctx, b.AddrInfo(), "/skyhive/test/none/1.0.0", nil); err == nil {
		t.Fatal("call to an unregistered protocol succeeded")
	}
}

func TestDeadlineAndCancel(t *testing.T) {
	for _, tr := range transports {
		t.Run(tr, func(t *testing.T) {
			a, b := pair(t, tr, Config{}, Config{})
			handlerDone := make(chan error, 2)
			b.SetHandler(slowProto, func(ctx context.Context, _ peer.ID, _ []byte) ([]byte, error) {
				select {
				case <-ctx.Done():
					handlerDone <- ctx.Err()
				case <-time.After(time.Minute): // a bound: Close must end ctx first
					handlerDone <- nil
				}
				return []byte("late"), nil
			})
			// Warm the connection so the deadline hits the call, not the dial.
			if _, err := a.Call(ctxT(t, 5*time.Second), b.AddrInfo(), echoProto, nil); err != nil {
				t.Fatal(err)
			}
			// The handler answers only when its ctx ends: a call returns
			// before that only if it honours its own deadline or cancel.
			err := callReturns(t, func() error {
				_, err := a.Call(ctxT(t, 200*time.Millisecond), b.AddrInfo(), slowProto, []byte("x"))
				return err
			})
			if !errors.Is(err, context.DeadlineExceeded) {
				t.Fatalf("err %v, want DeadlineExceeded", err)
			}
			ctx, cancel := context.WithCancel(context.Background())
			time.AfterFunc(100*time.Millisecond, cancel)
			err = callReturns(t, func() error {
				_, err := a.Call(ctx, b.AddrInfo(), slowProto, []byte("x"))
				return err
			})
			if !errors.Is(err, context.Canceled) {
				t.Fatalf("err %v, want Canceled", err)
			}
			// Host close ends the still running handlers' contexts.
			if err := b.Close(); err != nil {
				t.Fatal(err)
			}
			for range 2 {
				select {
				case err := <-handlerDone:
					if err == nil {
						t.Fatal("handler ran to completion instead of seeing Close")
					}
				default:
					t.Fatal("Close returned before the handlers")
				}
			}
		})
	}
}

// callReturns runs call and returns its error; it fails the test if call
// has not returned after 20 s (a bound on a hang, not a timing).
func callReturns(t *testing.T, call func() error) error {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- call() }()
	select {
	case err := <-done:
		return err
	case <-time.After(20 * time.Second):
		t.Fatal("the call did not return")
		return nil
	}
}

func TestMessageLimits(t *testing.T) {
	for _, tr := range transports {
		t.Run(tr, func(t *testing.T) {
			a, b := pair(t, tr, Config{MaxMessageBytes: 4 << 20}, Config{MaxMessageBytes: 1 << 20})
			b.SetHandler(bigProto, func(context.Context, peer.ID, []byte) ([]byte, error) {
				return make([]byte, 3<<20), nil // over b's own limit
			})
			a.SetHandler(bigProto, func(context.Context, peer.ID, []byte) ([]byte, error) {
				return make([]byte, 3<<20), nil // within a's, over b's
			})
			ctx := ctxT(t, 20*time.Second)
			// Over the client's own limit: rejected before sending.
			if _, err := a.Call(ctx, b.AddrInfo(), echoProto, make([]byte, 5<<20)); !errors.Is(err, ErrTooLarge) {
				t.Fatalf("local limit: err %v", err)
			}
			// Over the server's limit: the server says so and keeps serving.
			_, err := a.Call(ctx, b.AddrInfo(), echoProto, make([]byte, 3<<20))
			var re *RemoteError
			if !errors.As(err, &re) || !strings.Contains(re.Msg, "exceeds the limit") {
				t.Fatalf("remote limit: err %v", err)
			}
			_, err = a.Call(ctx, b.AddrInfo(), bigProto, nil)
			if !errors.As(err, &re) || !strings.Contains(re.Msg, "response of") {
				t.Fatalf("response over the server's limit: err %v", err)
			}
			_, err = b.Call(ctx, a.AddrInfo(), bigProto, nil)
			if !errors.Is(err, ErrTooLarge) {
				t.Fatalf("response over the caller's limit: err %v", err)
			}
			req := bytes.Repeat([]byte{7}, 1<<20)
			resp, err := a.Call(ctx, b.AddrInfo(), echoProto, req)
			if err != nil || !bytes.Equal(resp, req) {
				t.Fatalf("call at the limit after rejections: %d bytes, %v", len(resp), err)
			}
			if n := a.NumConns(b.ID()); n != 1 {
				t.Fatalf("%d connections after rejections", n)
			}
		})
	}
}

// TestSilentPeer checks a handler gives up on a caller that stops sending.
func TestSilentPeer(t *testing.T) {
	a, b := pair(t, "tcp", Config{}, Config{IdleTimeout: 200 * time.Millisecond})
	called := make(chan struct{}, 1)
	b.SetHandler(slowProto, func(context.Context, peer.ID, []byte) ([]byte, error) {
		called <- struct{}{}
		return nil, nil
	})
	b.SetStreamHandler(bigProto, func(_ context.Context, _ peer.ID, r io.Reader, _ io.Writer) error {
		_, err := io.Copy(io.Discard, r)
		return err
	})
	ctx := ctxT(t, 10*time.Second)
	if err := a.Connect(ctx, b.AddrInfo()); err != nil {
		t.Fatal(err)
	}
	for _, proto := range []protocol.ID{slowProto, bigProto} {
		s, err := a.LibP2P().NewStream(ctx, b.ID(), proto)
		if err != nil {
			t.Fatal(err)
		}
		// A request header promising 100 bytes, or a chunk promising 1000,
		// then silence.
		var partial []byte
		if proto == slowProto {
			partial = []byte{0, 0, 0, 100, 1, 2}
		} else {
			partial = []byte{frameData, 0, 0, 3, 232, 1}
		}
		if _, err := s.Write(partial); err != nil {
			t.Fatal(err)
		}
		// The handler gives up on its own: the stream ends before this
		// read deadline (a bound on a hang, not a timing).
		s.SetReadDeadline(time.Now().Add(20 * time.Second))
		got, err := io.ReadAll(s)
		if err == nil && proto == slowProto {
			t.Fatalf("%s: stream ended cleanly with %q", proto, got)
		}
		if isTimeout(err) {
			t.Fatalf("%s: the silent caller held the handler: %v", proto, err)
		}
		s.Reset()
	}
	select {
	case <-called:
		t.Fatal("handler ran on a partial request")
	default:
	}
}

// A caller that trickles its request just inside the idle timeout is cut
// off once the request is overdue at MinRequestRate; the handler never runs.
// TestSlowSenderCutOff: a request announcing 256 MiB (which the old bound,
// IdleTimeout + size/MinRequestRate, let trickle for 256 s) and arriving a
// byte every 100 ms is cut once it falls behind the floor rate, within
// about IdleTimeout, and its handler never runs.
func TestSlowSenderCutOff(t *testing.T) {
	a, b := pair(t, "tcp", Config{}, Config{IdleTimeout: 500 * time.Millisecond, MinRequestRate: 1 << 20, MaxMessageBytes: 512 << 20})
	called := make(chan struct{}, 1)
	b.SetHandler(slowProto, func(context.Context, peer.ID, []byte) ([]byte, error) {
		called <- struct{}{}
		return nil, nil
	})
	ctx := ctxT(t, 10*time.Second)
	if err := a.Connect(ctx, b.AddrInfo()); err != nil {
		t.Fatal(err)
	}
	s, err := a.LibP2P().NewStream(ctx, b.ID(), slowProto)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Reset()
	if _, err := s.Write([]byte{16, 0, 0, 0}); err != nil { // 256 MiB announced
		t.Fatal(err)
	}
	// The loop's 20 s only turn a hang into a failure.
	start := time.Now()
	cut := false
	for time.Since(start) < 20*time.Second {
		if _, err := s.Write([]byte{1}); err != nil {
			cut = true
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if d := time.Since(start); !cut || d > 10*time.Second {
		t.Fatalf("cut off %v after %v, want within about the idle timeout (0.5 s)", cut, d)
	}
	select {
	case <-called:
		t.Fatal("handler ran on a trickled request")
	default:
	}
}

func TestStreamLargeIntegrity(t *testing.T) {
	const size = 40 << 20
	for _, tr := range transports {
		t.Run(tr, func(t *testing.T) {
			a, b := pair(t, tr, Config{}, Config{})
			// The handler hashes the request, then streams back a
			// deterministic payload ending with the request's hash.
			b.SetStreamHandler(bigProto, func(_ context.Context, _ peer.ID, r io.Reader, w io.Writer) error {
				h := sha256.New()
				if _, err := io.Copy(h, r); err != nil {
					return err
				}
				if _, err := io.Copy(w, io.LimitReader(rand.NewChaCha8([32]byte{9}), size)); err != nil {
					return err
				}
				_, err := w.Write(h.Sum(nil))
				return err
			})
			src := rand.NewChaCha8([32]byte{1})
			want := sha256.New()
			var got []byte
			wantResp := sha256.New()
			io.Copy(wantResp, io.LimitReader(rand.NewChaCha8([32]byte{9}), size))
			gotResp := sha256.New()
			err := a.CallStream(ctxT(t, 60*time.Second), b.AddrInfo(), bigProto,
				func(w io.Writer) error {
					// Odd-sized writes exercise both the buffered and the direct path.
					buf := make([]byte, 3<<20+13)
					for sent := 0; sent < size; {
						n := min(len(buf), size-sent)
						src.Read(buf[:n])
						want.Write(buf[:n])
						if _, err := w.Write(buf[:n]); err != nil {
							return err
						}
						sent += n
					}
					return nil
				},
				func(r io.Reader) error {
					if _, err := io.CopyN(gotResp, r, size); err != nil {
						return err
					}
					var err error
					got, err = io.ReadAll(r)
					return err
				})
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, want.Sum(nil)) {
				t.Fatal("server's hash of the request differs")
			}
			if !bytes.Equal(gotResp.Sum(nil), wantResp.Sum(nil)) {
				t.Fatal("response hash differs")
			}
		})
	}
}

func TestStreamErrors(t *testing.T) {
	for _, tr := range transports {
		t.Run(tr, func(t *testing.T) {
			a, b := pair(t, tr, Config{}, Config{})
			handlerErr := make(chan error, 1)
			b.SetStreamHandler(failProto, func(_ context.Context, _ peer.ID, r io.Reader, w io.Writer) error {
				// Read a little, answer a little, then fail while the
				// caller is still sending.
				if _, err := io.ReadFull(r, make([]byte, 1000)); err != nil {
					return err
				}
				w.Write([]byte("partial"))
				return errors.New("expert overloaded")
			})
			b.SetStreamHandler(echoProto, func(_ context.Context, _ peer.ID, r io.Reader, w io.Writer) error {
				_, err := io.Copy(w, r)
				handlerErr <- err
				return err
			})
			b.SetStreamHandler(bigProto, func(_ context.Context, _ peer.ID, r io.Reader, w io.Writer) error {
				_, err := io.Copy(w, r)
				return err
			})
			b.SetStreamHandler(panicProto, func(context.Context, peer.ID, io.Reader, io.Writer) error {
				panic("bad expert")
			})
			ctx := ctxT(t, 30*time.Second)
			bigSend := func(w io.Writer) error {
				_, err := w.Write(make([]byte, 32<<20))
				return err
			}
			err := a.CallStream(ctx, b.AddrInfo(), failProto, bigSend, func(r io.Reader) error {
				_, err := io.ReadAll(r)
				return err
			})
			var re *RemoteError
			if !errors.As(err, &re) || re.Msg != "expert overloaded" {
				t.Fatalf("handler error: err %v", err)
			}
			// recv == nil still surfaces the remote error.
			err = a.CallStream(ctx, b.AddrInfo(), panicProto, nil, nil)
			if !errors.As(err, &re) || !strings.Contains(re.Msg, "bad expert") {
				t.Fatalf("handler panic: err %v", err)
			}
			// A failing send is reported as such and the handler sees it.
			errSend := errors.New("gradient not ready")
			err = a.CallStream(ctx, b.AddrInfo(), echoProto, func(w io.Writer) error {
				w.Write(make([]byte, 1<<20))
				return errSend
			}, nil)
			if !errors.Is(err, errSend) {
				t.Fatalf("send error: err %v", err)
			}
			if err := <-handlerErr; err == nil {
				t.Fatal("handler saw a clean end of an aborted request")
			}
			// A failing recv is reported too.
			errRecv := errors.New("bad shape")
			err = a.CallStream(ctx, b.AddrInfo(), bigProto, bigSend, func(io.Reader) error { return errRecv })
			if !errors.Is(err, errRecv) {
				t.Fatalf("recv error: err %v", err)
			}
			// And the host still serves.
			var out bytes.Buffer
			err = a.CallStream(ctx, b.AddrInfo(), echoProto, func(w io.Writer) error {
				_, err := w.Write([]byte("ok"))
				return err
			}, func(r io.Reader) error {
				_, err := io.Copy(&out, r)
				return err
			})
			if err != nil || out.String() != "ok" {
				t.Fatalf("after errors: %q, %v", out.String(), err)
			}
			if err := <-handlerErr; err != nil {
				t.Fatalf("handler: %v", err)
			}
			if n := a.NumConns(b.ID()); n != 1 {
				t.Fatalf("%d connections", n)
			}
		})
	}
}

func TestStreamLimit(t *testing.T) {
	a, b := pair(t, "tcp", Config{}, Config{MaxStreamBytes: 1 << 20})
	b.SetStreamHandler(bigProto, func(_ context.Context, _ peer.ID, r io.Reader, _ io.Writer) error {
		_, err := io.Copy(io.Discard, r)
		return err
	})
	err := a.CallStream(ctxT(t, 10*time.Second), b.AddrInfo(), bigProto, func(w io.Writer) error {
		_, err := w.Write(make([]byte, 2<<20))
		return err
	}, nil)
	var re *RemoteError
	if !errors.As(err, &re) || !strings.Contains(re.Msg, "too large") {
		t.Fatalf("err %v, want a remote 'too large'", err)
	}
}

// TestStreamTensors sends named tensors through a streamed call, as the
// expert client does.
func TestStreamTensors(t *testing.T) {
	a, b := pair(t, "quic", Config{}, Config{})
	b.SetStreamHandler(bigProto, func(_ context.Context, _ peer.ID, r io.Reader, w io.Writer) error {
		msg, err := wire.DecodeMessage(r, wire.Limits{})
		if err != nil {
			return err
		}
		x, y := wire.Get(msg, "x"), wire.Get(msg, "y")
		if x == nil || y == nil || len(x.Data) != len(y.Data) {
			return errors.New("need x and y of the same size")
		}
		sum := tensor.New(x.Shape...)
		tensor.Add(sum.Data, x.Data, y.Data)
		return wire.Encode(w, sum, wire.Options{})
	})
	x, y := tensor.New(256, 1024), tensor.New(256, 1024)
	for i := range x.Data {
		x.Data[i], y.Data[i] = float32(i), 1
	}
	var sum *tensor.Tensor
	err := a.CallStream(ctxT(t, 20*time.Second), b.AddrInfo(), bigProto, func(w io.Writer) error {
		return wire.EncodeMessage(w, []wire.Named{{Name: "x", Tensor: x}, {Name: "y", Tensor: y}}, wire.Options{Codec: wire.CodecFP16})
	}, func(r io.Reader) error {
		var err error
		sum, err = wire.Decode(r, wire.Limits{})
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	for i, v := range sum.Data {
		want := wire.HalfToFloat32(wire.Float32ToHalf(float32(i))) + 1
		if v != want {
			t.Fatalf("sum[%d] = %g, want %g", i, v, want)
		}
	}
}

func TestIdentityPersistence(t *testing.T) {
	path := filepath.Join(t.TempDir(), "id.key")
	start := func() peer.ID {
		h, err := New(context.Background(), Config{IdentityFile: path, ListenAddrs: []string{listenAddr("tcp")}})
		if err != nil {
			t.Fatal(err)
		}
		defer h.Close()
		return h.ID()
	}
	id1 := start()
	st, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if st.Mode().Perm() != 0o600 {
		t.Fatalf("identity mode %v, want 0600", st.Mode().Perm())
	}
	if id2 := start(); id2 != id1 {
		t.Fatalf("peer ID changed across restarts: %s -> %s", id1, id2)
	}
	if id3 := newHost(t, "tcp", Config{}).ID(); id3 == id1 {
		t.Fatal("ephemeral host reused the stored identity")
	}
	if err := os.Chmod(path, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := New(context.Background(), Config{IdentityFile: path}); err == nil || !strings.Contains(err.Error(), "chmod 600") {
		t.Fatalf("world-readable identity: err %v", err)
	}
	garbage := filepath.Join(t.TempDir(), "bad.key")
	os.WriteFile(garbage, []byte("not a key"), 0o600)
	if _, err := New(context.Background(), Config{IdentityFile: garbage}); err == nil {
		t.Fatal("accepted a garbage identity file")
	}
}

func TestConfigErrors(t *testing.T) {
	for _, cfg := range []Config{
		{ListenAddrs: []string{"not a multiaddr"}},
		{ListenAddrs: []string{listenAddr("tcp")}, AnnounceAddrs: []string{"/ip4/999.1.1.1/tcp/1"}},
		{ListenAddrs: []string{listenAddr("tcp")}, Security: Security(42)},
	} {
		if h, err := New(context.Background(), cfg); err == nil {
			h.Close()
			t.Errorf("New(%+v) succeeded", cfg)
		}
	}
	h := newHost(t, "tcp", Config{AnnounceAddrs: []string{"/ip4/203.0.113.7/tcp/4001"}})
	if ai := h.AddrInfo(); len(ai.Addrs) != 1 || ai.Addrs[0].String() != "/ip4/203.0.113.7/tcp/4001" {
		t.Fatalf("announced %v", ai.Addrs)
	}
	if _, err := h.Call(context.Background(), h.AddrInfo(), echoProto, nil); err == nil {
		t.Fatal("call to self succeeded")
	}
}

// TestOptionalServices starts hosts with relay, hole punching and AutoNAT
// enabled and checks a relayed connection works end to end on loopback.
func TestOptionalServices(t *testing.T) {
	relay := newHost(t, "tcp", Config{RelayService: true, AutoNAT: true, HolePunching: true, Reachability: ReachabilityPublic})
	b := newHost(t, "tcp", Config{StaticRelays: []peer.AddrInfo{relay.AddrInfo()}, HolePunching: true, Reachability: ReachabilityPrivate})
	b.SetHandler(echoProto, echo)
	a := newHost(t, "tcp", Config{RelayClient: true})
	ctx := ctxT(t, 20*time.Second)
	// b reserved a slot on its static relay in New and announces the
	// circuit address (libp2p's autorelay would announce only public ones).
	var circuits []ma.Multiaddr
	for _, a := range b.AddrInfo().Addrs {
		if strings.Contains(a.String(), "/p2p-circuit") {
			circuits = append(circuits, a)
		}
	}
	if len(circuits) == 0 {
		t.Fatalf("b announces no circuit address: %v", b.AddrInfo().Addrs)
	}
	if r := b.Reach(); r.Status != "relay" {
		t.Errorf("b's reachability %q, want relay", r.Status)
	}
	to := peer.AddrInfo{ID: b.ID(), Addrs: circuits}
	for attempt := 0; ; attempt++ {
		resp, err := a.Call(ctxT(t, 2*time.Second), to, echoProto, []byte("via relay"))
		if err == nil && string(resp) == "via relay" {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("relayed call after %d attempts: %q, %v", attempt, resp, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	conns := a.LibP2P().Network().ConnsToPeer(b.ID())
	if len(conns) != 1 || !strings.Contains(conns[0].RemoteMultiaddr().String(), "p2p-circuit") {
		t.Fatalf("connections to b: %v, want one relayed", conns)
	}
}

// TestSimultaneousDials: two peers that call each other at the same
// instant, with no connection yet, both get through. Over TCP with
// reuseport both dials would leave from the listening ports, so the two
// SYNs could meet as one TCP connection on which both ends start the
// security handshake as its client; both dials fail, and libp2p refuses
// every dial to the address for its 5 s backoff. (With reuseport on, the
// first of these pairs failed in every run.)
func TestSimultaneousDials(t *testing.T) {
	const pairs = 30
	for i := range pairs {
		tr := transports[i%len(transports)]
		a := newHost(t, tr, Config{})
		b := newHost(t, tr, Config{})
		a.SetHandler(echoProto, echo)
		b.SetHandler(echoProto, echo)
		ctx := ctxT(t, 10*time.Second)
		start := make(chan struct{})
		var wg sync.WaitGroup
		errs := make([]error, 2)
		for j, h := range []*Host{a, b} {
			to := b.AddrInfo()
			if j == 1 {
				to = a.AddrInfo()
			}
			wg.Go(func() {
				<-start
				_, errs[j] = h.Call(ctx, to, echoProto, []byte("hi"))
			})
		}
		close(start)
		wg.Wait()
		for j, err := range errs {
			if err != nil {
				t.Fatalf("%s pair %d, host %d: %v", tr, i, j, err)
			}
		}
		a.Close()
		b.Close()
	}
}

// A host that closes while it serves a call still answers it (a peer
// leaving right after a collective delivers the means it owes), and refuses
// calls that arrive after it began closing.
func TestCloseAnswersCallsInFlight(t *testing.T) {
	for _, tr := range transports {
		t.Run(tr, func(t *testing.T) {
			a := newHost(t, tr, Config{})
			cfg := Config{ListenAddrs: []string{listenAddr(tr)}}
			b, err := New(context.Background(), cfg)
			if err != nil {
				t.Fatal(err)
			}
			entered, release := make(chan struct{}), make(chan struct{})
			big := bytes.Repeat([]byte{7}, 4<<20)
			b.SetHandler(slowProto, func(context.Context, peer.ID, []byte) ([]byte, error) {
				close(entered)
				<-release
				return big, nil
			})
			ctx := ctxT(t, 20*time.Second)
			info := b.AddrInfo()
			got := make(chan error, 1)
			go func() {
				resp, err := a.Call(ctx, info, slowProto, []byte("x"))
				if err == nil && !bytes.Equal(resp, big) {
					err = fmt.Errorf("response of %d bytes, want %d", len(resp), len(big))
				}
				got <- err
			}()
			<-entered
			closed := make(chan error, 1)
			go func() { closed <- b.Close() }()
			for !b.isClosing() {
				time.Sleep(time.Millisecond)
			}
			close(release)
			if err := <-got; err != nil {
				t.Fatalf("the call served while the host closed: %v", err)
			}
			if err := <-closed; err != nil {
				t.Fatal(err)
			}
			if _, err := a.Call(ctx, info, slowProto, []byte("x")); err == nil {
				t.Fatal("a closed host answered a call")
			}
		})
	}
}

// trickle opens a call stream from a to b that announces 1 MiB and sends
// a byte every 50 ms until b cuts it; it fails the test after 20 s.
func trickle(t *testing.T, ctx context.Context, a, b *Host) {
	t.Helper()
	s, err := a.LibP2P().NewStream(ctx, b.ID(), slowProto)
	if err != nil {
		return // refused at once: cut too
	}
	defer s.Reset()
	if _, err := s.Write([]byte{0, 16, 0, 0}); err != nil {
		return
	}
	for start := time.Now(); time.Since(start) < 20*time.Second; time.Sleep(50 * time.Millisecond) {
		if _, err := s.Write([]byte{1}); err != nil {
			return
		}
	}
	t.Fatal("a trickled request was held for 20 s")
}

// TestSlowPeerBlocked: a peer whose requests are cut for arriving too
// slowly three times is blocked, so its streams stop holding handlers;
// other peers are still served.
func TestSlowPeerBlocked(t *testing.T) {
	a, b := pair(t, "tcp", Config{}, Config{IdleTimeout: 300 * time.Millisecond, MinRequestRate: 1 << 20})
	b.SetHandler(slowProto, echo)
	ctx := ctxT(t, 20*time.Second)
	if err := a.Connect(ctx, b.AddrInfo()); err != nil {
		t.Fatal(err)
	}
	for i := range slowStrikes {
		if b.BlockList().Blocked(a.ID()) {
			t.Fatalf("blocked after %d cuts, want %d", i, slowStrikes)
		}
		trickle(t, ctx, a, b)
		time.Sleep(50 * time.Millisecond) // the cut is counted after the reset
	}
	for start := time.Now(); !b.BlockList().Blocked(a.ID()); time.Sleep(10 * time.Millisecond) {
		if time.Since(start) > 5*time.Second {
			t.Fatalf("not blocked after %d cuts", slowStrikes)
		}
	}
	c := newHost(t, "tcp", Config{})
	if resp, err := c.Call(ctx, b.AddrInfo(), echoProto, []byte("hi")); err != nil || string(resp) != "hi" {
		t.Fatalf("another peer's call: %q, %v", resp, err)
	}
}

// RequestMemory bounds the request bytes a host reads or handles at once,
// and one peer's share of them: a peer whose requests fill its quarter is
// told the host is busy before its next request's bytes are read, while
// another peer is still served; the bytes come back when the handlers
// return.
func TestRequestMemoryShared(t *testing.T) {
	const limit = 4 << 20
	a, b := pair(t, "tcp", Config{}, Config{RequestMemory: limit})
	c := newHost(t, "tcp", Config{})
	release := make(chan struct{})
	held := make(chan struct{}, 8)
	b.SetHandler(slowProto, func(ctx context.Context, _ peer.ID, req []byte) ([]byte, error) {
		held <- struct{}{}
		select {
		case <-release:
		case <-ctx.Done():
		}
		return []byte{byte(len(req) >> 20)}, nil
	})
	ctx := ctxT(t, 20*time.Second)
	req := make([]byte, 600<<10)
	// a's first request holds 600 KiB of its 1 MiB share.
	first := make(chan error, 1)
	go func() {
		_, err := a.Call(ctx, b.AddrInfo(), slowProto, req)
		first <- err
	}()
	<-held
	if _, err := a.Call(ctx, b.AddrInfo(), slowProto, req); err == nil || !strings.Contains(err.Error(), "busy") || !strings.Contains(err.Error(), "share") {
		t.Fatalf("a's second request over its share: %v, want busy", err)
	}
	// Another peer is served meanwhile.
	other := make(chan error, 1)
	go func() {
		_, err := c.Call(ctx, b.AddrInfo(), slowProto, req)
		other <- err
	}()
	<-held
	close(release)
	if err := <-first; err != nil {
		t.Fatalf("a's first request: %v", err)
	}
	if err := <-other; err != nil {
		t.Fatalf("c's request: %v", err)
	}
	if _, err := a.Call(ctx, b.AddrInfo(), slowProto, req); err != nil {
		t.Fatalf("a's request after its share came back: %v", err)
	}
	// The handler's bytes come back once it has answered; the loop's
	// bound only turns a leak into a failure.
	var total int64
	for start := time.Now(); time.Since(start) < 5*time.Second; time.Sleep(10 * time.Millisecond) {
		b.mu.Lock()
		total = b.reqs.total
		b.mu.Unlock()
		if total == 0 {
			return
		}
	}
	t.Fatalf("%d request bytes still counted", total)
}

// A peer may have MaxPendingPerPeer requests of a protocol arriving at
// once, and an address MaxPendingPerAddr: a further stream is told the
// host is busy before anything is read, while another peer's and another
// protocol's calls are served.
func TestPendingReadsBounded(t *testing.T) {
	a, b := pair(t, "tcp", Config{}, Config{MaxPendingPerPeer: 2, MaxPendingPerAddr: 3})
	c := newHost(t, "tcp", Config{})
	b.SetHandler(slowProto, echo)
	ctx := ctxT(t, 20*time.Second)
	if err := a.Connect(ctx, b.AddrInfo()); err != nil {
		t.Fatal(err)
	}
	// Two requests from a that announce 1 KiB and send nothing more.
	for range 2 {
		s, err := a.LibP2P().NewStream(ctx, b.ID(), slowProto)
		if err != nil {
			t.Fatal(err)
		}
		defer s.Reset()
		if _, err := s.Write([]byte{0, 0, 4, 0}); err != nil {
			t.Fatal(err)
		}
	}
	busy := func(h *Host, want string) {
		t.Helper()
		// The held streams reach b's handler goroutines soon after they
		// open; the loop's bound only turns a hang into a failure.
		var err error
		for start := time.Now(); time.Since(start) < 5*time.Second; time.Sleep(20 * time.Millisecond) {
			if _, err = h.Call(ctx, b.AddrInfo(), slowProto, []byte("x")); err != nil {
				break
			}
		}
		if err == nil || !strings.Contains(err.Error(), "busy") || !strings.Contains(err.Error(), want) {
			t.Fatalf("call over the bound: %v, want busy (%s)", err, want)
		}
	}
	busy(a, "your requests")
	if _, err := a.Call(ctx, b.AddrInfo(), echoProto, []byte("x")); err != nil {
		t.Fatalf("another protocol from the same peer: %v", err)
	}
	// c shares a's address (loopback): it may have one more.
	if _, err := c.Call(ctx, b.AddrInfo(), slowProto, []byte("x")); err != nil {
		t.Fatalf("another peer: %v", err)
	}
	s, err := c.LibP2P().NewStream(ctx, b.ID(), slowProto)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Reset()
	if _, err := s.Write([]byte{0, 0, 4, 0}); err != nil {
		t.Fatal(err)
	}
	busy(c, "your address")
}
