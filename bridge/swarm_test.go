package bridge

import (
	"context"
	"fmt"
	"net"
	"sync"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/skyhive/skyhive/dht"
	"github.com/skyhive/skyhive/p2p"
)

// testClient is a client of the protocol written in Go: one parameter
// vector, plain SGD as its own optimizer.
type testClient struct {
	c             *net.UnixConn
	params, grads []float32
	lr            float32
	innerSteps    int
	joined        Message
}

func newTestClient(t *testing.T, sock, options string, init []float32, lr float32) *testClient {
	t.Helper()
	c := dial(t, sock)
	send(t, c, Message{Op: OpHello, Version: Version, Params: []ParamSpec{{Name: "w", Shape: []int{len(init)}}}, Options: []byte(options)})
	m, fd := recvFD(t, c)
	if m.Op != OpShm || fd < 0 {
		t.Fatalf("hello: %+v", m)
	}
	mem, err := unix.Mmap(fd, 0, m.Bytes, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	unix.Close(fd)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Munmap(mem) })
	all := unsafe.Slice((*float32)(unsafe.Pointer(&mem[0])), m.Elements)
	tc := &testClient{c: c, params: all[:len(init)], grads: all[len(init):], lr: lr}
	copy(tc.params, init)
	return tc
}

func (tc *testClient) join() error {
	if err := writeMessage(tc.c, Message{Op: OpJoin}, nil); err != nil {
		return err
	}
	m, err := ReadMessage(tc.c)
	if err != nil {
		return err
	}
	if m.Op != OpJoined {
		return fmt.Errorf("join: %+v", m)
	}
	tc.joined = m
	return nil
}

// step writes grad and steps, taking the inner steps the daemon asks for.
func (tc *testClient) step(grad []float32) (Message, error) {
	copy(tc.grads, grad)
	if err := writeMessage(tc.c, Message{Op: OpStep, Samples: 1}, nil); err != nil {
		return Message{}, err
	}
	for {
		m, err := ReadMessage(tc.c)
		if err != nil {
			return m, err
		}
		switch m.Op {
		case OpInnerStep:
			for i := range tc.params {
				tc.params[i] -= tc.lr * tc.grads[i]
			}
			tc.innerSteps++
			if err := writeMessage(tc.c, Message{Op: OpInnerDone}, nil); err != nil {
				return m, err
			}
		default:
			return m, nil
		}
	}
}

func startTestDHT(t *testing.T) string {
	t.Helper()
	h, err := p2p.New(context.Background(), p2p.Config{ListenAddrs: []string{"/ip4/127.0.0.1/tcp/0"}})
	if err != nil {
		t.Fatal(err)
	}
	node, err := dht.New(h, dht.Config{PrivKey: h.LibP2P().Peerstore().PrivKey(h.ID())})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { node.Close(); h.Close() })
	ai := h.AddrInfo()
	return fmt.Sprintf("%s/p2p/%s", ai.Addrs[0], ai.ID)
}

// TestTwoClientsAllReduce: two clients of one daemon, each a peer of its
// own, average their gradients every step (algo allreduce) and end with
// the parameters of SGD on the mean gradient; a NaN gradient is refused
// without a step, and the session goes on.
func TestTwoClientsAllReduce(t *testing.T) {
	sock := serve(t, Config{MaxSessions: 2})
	opts := fmt.Sprintf(`{"dht":[%q],"listen":["/ip4/127.0.0.1/tcp/0"],"run_id":"bridge-test","algo":"allreduce","min_peers":2,"status_every":"0s","autonat":false}`, startTestDHT(t))
	const n, steps, lr = 10, 4, 0.1
	init := make([]float32, n)
	for i := range init {
		init[i] = float32(i)
	}
	grad := func(peer, step, i int) float32 { return float32((peer+1)*(i+1)) * float32(step+1) / 10 }
	clients := []*testClient{newTestClient(t, sock, opts, init, lr), newTestClient(t, sock, opts, init, lr)}
	var wg sync.WaitGroup
	errs := make([]error, 2)
	for p, tc := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if errs[p] = tc.join(); errs[p] != nil {
				return
			}
			for s := 0; s < steps; s++ {
				g := make([]float32, n)
				for i := range g {
					g[i] = grad(p, s, i)
				}
				m, err := tc.step(g)
				if err == nil && m.Op != OpStepped {
					err = fmt.Errorf("step %d: %+v", s, m)
				}
				if err != nil {
					errs[p] = err
					return
				}
			}
		}()
	}
	wg.Wait()
	for p, err := range errs {
		if err != nil {
			t.Fatalf("client %d: %v", p, err)
		}
	}
	want := append([]float32(nil), init...)
	for s := 0; s < steps; s++ {
		for i := range want {
			want[i] -= lr * (grad(0, s, i) + grad(1, s, i)) / 2
		}
	}
	for p, tc := range clients {
		if tc.innerSteps != steps {
			t.Errorf("client %d took %d inner steps, want %d", p, tc.innerSteps, steps)
		}
		for i := range want {
			if d := tc.params[i] - want[i]; d > 1e-5 || d < -1e-5 {
				t.Fatalf("client %d: w[%d] = %v, want %v", p, i, tc.params[i], want[i])
			}
		}
	}

	// A NaN gradient: refused, the parameters untouched, the session on.
	tc := clients[0]
	before := append([]float32(nil), tc.params...)
	bad := make([]float32, n)
	bad[3] = float32(nanValue())
	m, err := tc.step(bad)
	if err != nil || m.Op != OpError || m.Kind != KindValue {
		t.Fatalf("NaN gradient: %+v, %v", m, err)
	}
	for i := range before {
		if tc.params[i] != before[i] {
			t.Fatalf("a refused step changed w[%d]", i)
		}
	}
	if err := writeMessage(tc.c, Message{Op: OpStatus}, nil); err != nil {
		t.Fatal(err)
	}
	_ = tc.c.SetReadDeadline(time.Now().Add(10 * time.Second))
	if m, err := ReadMessage(tc.c); err != nil || m.Op != OpStatus || m.Stats == nil || m.Stats.Steps != steps {
		t.Fatalf("status after the refused step: %+v, %v", m, err)
	}
	for _, tc := range clients {
		if err := writeMessage(tc.c, Message{Op: OpClose}, nil); err != nil {
			t.Fatal(err)
		}
		if m, err := ReadMessage(tc.c); err != nil || m.Op != OpClosed {
			t.Fatalf("close: %+v, %v", m, err)
		}
	}
}

func nanValue() float64 {
	var zero float64
	return zero / zero
}
