package bridge

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/skyhive/skyhive/dht"
	"github.com/skyhive/skyhive/moe/server"
	"github.com/skyhive/skyhive/nn"
	"github.com/skyhive/skyhive/p2p"
	"github.com/skyhive/skyhive/tensor"
)

// startExpertServer runs Go FFN experts ffn.0.0 … ffn.1.1 of hidden size
// hidden on a host that is also the DHT's first node; it returns the
// server and the host's multiaddr.
func startExpertServer(t *testing.T, hidden int) (*server.Server, string) {
	t.Helper()
	h, err := p2p.New(context.Background(), p2p.Config{ListenAddrs: []string{"/ip4/127.0.0.1/tcp/0"}})
	if err != nil {
		t.Fatal(err)
	}
	d, err := dht.New(h, dht.Config{PrivKey: h.LibP2P().Peerstore().PrivKey(h.ID())})
	if err != nil {
		t.Fatal(err)
	}
	srv, err := server.New(server.Config{Transport: h, DHT: d, Experts: []string{"ffn.0.0", "ffn.0.1", "ffn.1.0", "ffn.1.1"},
		Hidden: hidden, Seed: 3, DeclareEvery: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Close(); d.Close(); h.Close() })
	ai := h.AddrInfo()
	return srv, fmt.Sprintf("%s/p2p/%s", ai.Addrs[0], ai.ID)
}

// localExpert is a copy of a served expert, for reference values.
func localExpert(t *testing.T, srv *server.Server, uid string, hidden int) nn.Module {
	t.Helper()
	e := server.BuildExpert(server.TypeFFN, hidden, 1, rand.New(rand.NewPCG(0, 0)))
	if err := nn.ImportParams(e.Params(), srv.ExpertWeights(uid)); err != nil {
		t.Fatal(err)
	}
	return e
}

// TestMoESession drives a MoE session as skyhive.RemoteMixtureOfExperts
// does: the answers of the chosen experts come back in the shared memory
// and equal the experts computed here; the backward pass returns the sum
// of their input gradients; bad input is refused and the session goes on.
func TestMoESession(t *testing.T) {
	const hidden, rows = 8, 3
	srv, addr := startExpertServer(t, hidden)
	sock := serve(t, Config{})
	c := dial(t, sock)
	opts := fmt.Sprintf(`{"dht":[%q],"listen":["/ip4/127.0.0.1/tcp/0"]}`, addr)
	send(t, c, Message{Op: OpHello, Version: Version, Mode: ModeMoE, Options: json.RawMessage(opts),
		MoE: &MoEOptions{UIDPrefix: "ffn", GridSize: []int{2, 2}, InFeatures: hidden, MaxRows: 4, KBest: 2, ForwardTimeout: 10}})
	shm, fd := recvFD(t, c)
	if shm.Op != OpShm || fd < 0 {
		t.Fatalf("hello answered %+v", shm)
	}
	mem, err := unix.Mmap(fd, 0, shm.Bytes, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	unix.Close(fd)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Munmap(mem)
	buf := unsafe.Slice((*float32)(unsafe.Pointer(&mem[0])), shm.Elements)
	lay := moeLayout{in: hidden, row: hidden, k: 2, total: 4, rows: 4}
	lay.out, lay.scores = lay.rows*lay.row, lay.rows*lay.row+lay.rows*lay.k*lay.row

	rng := rand.New(rand.NewPCG(1, 1))
	x := tensor.New(rows, hidden)
	tensor.FillNormal(x.Data, rng, 0, 1)
	// Sample i prefers expert ffn.a.b with scores that rank (i%2, 0) and
	// then (i%2, 1).
	scores := make([]float32, rows*4)
	for i := range rows {
		scores[i*4+i%2] = 5
		scores[i*4+2] = 2
		scores[i*4+3] = 1
	}
	forward := func(keep bool) Message {
		copy(buf, x.Data)
		copy(buf[lay.scores:], scores)
		send(t, c, Message{Op: OpMoEForward, Shape: x.Shape, Keep: keep})
		m, err := ReadMessage(c)
		if err != nil {
			t.Fatal(err)
		}
		return m
	}
	var out Message
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		if out = forward(true); out.Op == OpMoEOut && len(out.Coords) == rows && len(out.Coords[0]) == 2 || time.Now().After(deadline) {
			break
		}
	}
	if out.Op != OpMoEOut {
		t.Fatalf("forward: %+v", out)
	}
	experts := map[string]nn.Module{}
	wantDX := tensor.New(rows, hidden)
	dys := make([]*tensor.Tensor, 0)
	for i := range rows {
		if len(out.Coords[i]) != 2 {
			t.Fatalf("sample %d: %d candidates, want 2", i, len(out.Coords[i]))
		}
		for j, co := range out.Coords[i] {
			if want := []int{i % 2, j}; co[0] != want[0] || co[1] != want[1] || !out.Answered[i][j] {
				t.Fatalf("sample %d candidate %d: %v (answered %v), want %v", i, j, co, out.Answered[i][j], want)
			}
			uid := fmt.Sprintf("ffn.%d.%d", co[0], co[1])
			if experts[uid] == nil {
				experts[uid] = localExpert(t, srv, uid, hidden)
			}
			xi := tensor.FromSlice(append([]float32(nil), x.Data[i*hidden:(i+1)*hidden]...), 1, hidden)
			y, st := experts[uid].Forward(nn.Ctx{Train: true}, xi)
			got := buf[lay.out+(i*lay.k+j)*hidden:][:hidden]
			for e := range hidden {
				if math.Abs(float64(got[e]-y.Data[e])) > 1e-5 {
					t.Fatalf("sample %d expert %s: answer %v, want %v", i, uid, got, y.Data)
				}
			}
			dy := tensor.New(1, hidden)
			tensor.FillNormal(dy.Data, rng, 0, 0.1)
			dys = append(dys, dy)
			dx := experts[uid].Backward(st, dy)
			tensor.Axpy(1, dx.Data, wantDX.Data[i*hidden:(i+1)*hidden])
		}
	}
	for i := range rows {
		for j := range 2 {
			copy(buf[lay.out+(i*lay.k+j)*hidden:], dys[i*2+j].Data)
		}
	}
	send(t, c, Message{Op: OpMoEBackward, Call: out.Call})
	if m, err := ReadMessage(c); err != nil || m.Op != OpMoEDX {
		t.Fatalf("backward: %+v, %v", m, err)
	}
	for e := range wantDX.Data {
		if math.Abs(float64(buf[e]-wantDX.Data[e])) > 1e-5 {
			t.Fatalf("dx[%d] = %g, want %g", e, buf[e], wantDX.Data[e])
		}
	}

	// Bad input is refused and the session goes on.
	refused := func(name string, m Message, prep func()) {
		t.Helper()
		if prep != nil {
			prep()
		}
		send(t, c, m)
		got, err := ReadMessage(c)
		if err != nil || got.Op != OpError || got.Kind != KindValue {
			t.Fatalf("%s: %+v, %v; want a value error", name, got, err)
		}
	}
	refused("wrong hidden size", Message{Op: OpMoEForward, Shape: []int{2, hidden + 1}}, nil)
	refused("too many rows", Message{Op: OpMoEForward, Shape: []int{5, hidden}}, nil)
	refused("rank 4", Message{Op: OpMoEForward, Shape: []int{1, 1, 1, hidden}}, nil)
	refused("backward twice", Message{Op: OpMoEBackward, Call: out.Call}, nil)
	refused("NaN input", Message{Op: OpMoEForward, Shape: []int{1, hidden}}, func() { buf[0] = float32(math.NaN()) })
	refused("NaN score", Message{Op: OpMoEForward, Shape: []int{1, hidden}}, func() { buf[0], buf[lay.scores] = 0, float32(math.Inf(1)) })
	buf[lay.scores] = 0
	if m := forward(false); m.Op != OpMoEOut || m.Call != 0 {
		t.Fatalf("forward after refusals: %+v", m)
	}
	send(t, c, Message{Op: OpClose})
	if m, err := ReadMessage(c); err != nil || m.Op != OpClosed {
		t.Fatalf("close: %+v, %v", m, err)
	}
}

// TestMoESessionRefusesBadOptions: options that do not describe a grid or
// a layout that fits are refused before anything is started.
func TestMoESessionRefusesBadOptions(t *testing.T) {
	sock := serve(t, Config{MaxElements: 1 << 20})
	good := MoEOptions{UIDPrefix: "ffn", GridSize: []int{2, 2}, InFeatures: 8, KBest: 2}
	for name, edit := range map[string]func(o *MoEOptions){
		"no grid":           func(o *MoEOptions) { o.GridSize = nil },
		"dotted prefix":     func(o *MoEOptions) { o.UIDPrefix = "a.b" },
		"k_best 0":          func(o *MoEOptions) { o.KBest = 0 },
		"k_min over k_best": func(o *MoEOptions) { o.KMin = 3 },
		"row not multiple":  func(o *MoEOptions) { o.RowElements = 12 },
		"too large":         func(o *MoEOptions) { o.MaxRows, o.InFeatures = 1<<14, 1<<10 },
		"negative timeout":  func(o *MoEOptions) { o.ForwardTimeout = -1 },
	} {
		o := good
		edit(&o)
		c := dial(t, sock)
		send(t, c, Message{Op: OpHello, Version: Version, Mode: ModeMoE, MoE: &o, Options: json.RawMessage(`{"dht":["/ip4/127.0.0.1/tcp/9/p2p/12D3KooWDpJ7As7BWAwRMfu1VU2WCqNjvq387JEYKDBj4kx6nXTN"]}`)})
		got, err := ReadMessage(c)
		if err != nil || got.Op != OpError || got.Kind != KindConfig {
			t.Errorf("%s: %+v, %v; want a config error", name, got, err)
		}
		c.Close()
	}
	c := dial(t, sock)
	send(t, c, Message{Op: OpHello, Version: Version, Mode: "pipeline"})
	if got, err := ReadMessage(c); err != nil || got.Kind != KindConfig {
		t.Errorf("unknown mode: %+v, %v", got, err)
	}
}
