package server

import (
	"context"
	crand "crypto/rand"
	"errors"
	"math"
	"math/rand/v2"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/crypto"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/core/protocol"
	ma "github.com/multiformats/go-multiaddr"
	"go.uber.org/goleak"

	"github.com/skyhive/skyhive/dht"
	"github.com/skyhive/skyhive/moe"
	"github.com/skyhive/skyhive/nn"
	"github.com/skyhive/skyhive/optim"
	"github.com/skyhive/skyhive/p2p"
	"github.com/skyhive/skyhive/p2p/memnet"
	"github.com/skyhive/skyhive/tensor"
	"github.com/skyhive/skyhive/wire"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m,
		goleak.IgnoreAnyFunction("github.com/ipfs/go-log/v2/writer.(*MirrorWriter).logRoutine"),
		goleak.IgnoreAnyFunction("go.opencensus.io/stats/view.(*worker).start"),
	)
}

func randTensor(seed uint64, shape ...int) *tensor.Tensor {
	t := tensor.New(shape...)
	tensor.FillNormal(t.Data, rand.New(rand.NewPCG(seed, 1)), 0, 1)
	return t
}

type env struct {
	net    *memnet.Network
	srv    *memnet.Peer
	client *memnet.Peer
}

func newEnv(t *testing.T) *env {
	t.Helper()
	n := memnet.NewNetwork()
	t.Cleanup(func() { n.Close() })
	srv, err := n.NewPeer()
	if err != nil {
		t.Fatal(err)
	}
	cl, err := n.NewPeer()
	if err != nil {
		t.Fatal(err)
	}
	return &env{net: n, srv: srv, client: cl}
}

func (e *env) call(ctx context.Context, proto protocol.ID, uid string, msg ...wire.Named) ([]wire.Named, error) {
	req, err := moe.EncodeRequest(uid, msg, wire.Options{})
	if err != nil {
		return nil, err
	}
	resp, err := e.client.Call(ctx, e.srv.AddrInfo(), proto, req)
	if err != nil {
		return nil, err
	}
	return wire.UnmarshalMessage(resp, wire.Limits{})
}

func TestForwardBackwardUpdatesExpert(t *testing.T) {
	e := newEnv(t)
	s, err := New(Config{Transport: e.srv, Experts: []string{"ffn.0", "ffn.1"}, Hidden: 8, LR: 0.01, Seed: 3})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	x := randTensor(1, 4, 8)
	// The server's answer equals the same expert run locally.
	ref := BuildExpert(TypeFFN, 8, 1, rand.New(rand.NewPCG(0, 0)))
	if err := importInto(ref, s.ExpertWeights("ffn.1")); err != nil {
		t.Fatal(err)
	}
	want := forwardLocal(ref, x)
	out, err := e.call(ctx, moe.ForwardProtocol, "ffn.1", wire.Named{Name: "x", Tensor: x})
	if err != nil {
		t.Fatal(err)
	}
	if d := maxDiff(wire.Get(out, "y").Data, want.Data); d > 1e-6 {
		t.Fatalf("forward differs from local expert by %g", d)
	}
	before := s.ExpertWeights("ffn.1")["ffn.fc1.weight"].Clone()
	dy := randTensor(2, 4, 8)
	out, err = e.call(ctx, moe.BackwardProtocol, "ffn.1", wire.Named{Name: "x", Tensor: x}, wire.Named{Name: "dy", Tensor: dy})
	if err != nil {
		t.Fatal(err)
	}
	if dx := wire.Get(out, "dx"); dx == nil || !slices.Equal(dx.Shape, x.Shape) {
		t.Fatalf("backward answer %v", out)
	}
	after := s.ExpertWeights("ffn.1")["ffn.fc1.weight"]
	if maxDiff(before.Data, after.Data) == 0 {
		t.Fatal("backward did not update the expert")
	}
	st := s.Stats()
	if st.Experts[1].Forward.Requests != 1 || st.Experts[1].Backward.Requests != 1 || st.Experts[1].Updates != 1 || st.Experts[0].Forward.Requests != 0 {
		t.Fatalf("stats %+v", st.Experts)
	}
}

// With StepRows, backward calls accumulate gradients and the expert takes
// one AdamW step on their mean once enough rows have arrived, matching a
// local expert that does the same.
func TestStepRowsAccumulates(t *testing.T) {
	e := newEnv(t)
	cfg := Config{Transport: e.srv, Experts: []string{"ffn.0"}, Hidden: 8, LR: 0.01, Seed: 5, StepRows: 6}
	s, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ref := BuildExpert(TypeFFN, 8, 1, rand.New(rand.NewPCG(0, 0)))
	if err := importInto(ref, s.ExpertWeights("ffn.0")); err != nil {
		t.Fatal(err)
	}
	opt := optim.NewAdamW(ref.Params(), optim.AdamWConfig{LR: 0.01, NoDecay: optim.NoDecayVectors})
	opt.ZeroGrad()
	before := s.ExpertWeights("ffn.0")["ffn.fc1.weight"].Clone()
	for i := range 2 {
		x, dy := randTensor(uint64(10+i), 4, 8), randTensor(uint64(20+i), 4, 8)
		if _, err := e.call(ctx, moe.BackwardProtocol, "ffn.0", wire.Named{Name: "x", Tensor: x}, wire.Named{Name: "dy", Tensor: dy}); err != nil {
			t.Fatal(err)
		}
		_, st := ref.Forward(nn.Ctx{Train: true}, x)
		ref.Backward(st, dy)
		if i == 0 {
			if d := maxDiff(before.Data, s.ExpertWeights("ffn.0")["ffn.fc1.weight"].Data); d != 0 {
				t.Fatalf("the expert stepped after 4 of 6 rows (weights moved by %g)", d)
			}
		}
	}
	for _, p := range ref.Params() {
		tensor.Scale(0.5, p.Grad.Data)
	}
	opt.Step()
	got := s.ExpertWeights("ffn.0")
	for _, p := range ref.Params() {
		if d := maxDiff(got[p.Name].Data, p.Value.Data); d > 1e-6 {
			t.Fatalf("%s differs from the local reference by %g", p.Name, d)
		}
	}
	if st := s.Stats().Experts[0]; st.Updates != 1 || st.Backward.Requests != 2 {
		t.Fatalf("stats %+v, want 1 update from 2 backward requests", st)
	}
}

// A ZeroInit expert starts as the identity and leaves it after a backward
// call; transformer experts refuse the option.
func TestZeroInit(t *testing.T) {
	e := newEnv(t)
	if _, err := New(Config{Transport: e.srv, Experts: []string{"t.0"}, Type: TypeTransformer, Hidden: 8, ZeroInit: true}); err == nil {
		t.Fatal("ZeroInit accepted for transformer experts")
	}
	s, err := New(Config{Transport: e.srv, Experts: []string{"ffn.0"}, Hidden: 8, LR: 0.01, ZeroInit: true, Lazy: true})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	x := randTensor(1, 4, 8)
	fwd := func() *tensor.Tensor {
		out, err := e.call(ctx, moe.ForwardProtocol, "ffn.0", wire.Named{Name: "x", Tensor: x})
		if err != nil {
			t.Fatal(err)
		}
		return wire.Get(out, "y")
	}
	if d := maxDiff(fwd().Data, x.Data); d != 0 {
		t.Fatalf("fresh expert is not the identity: differs by %g", d)
	}
	if _, err := e.call(ctx, moe.BackwardProtocol, "ffn.0", wire.Named{Name: "x", Tensor: x}, wire.Named{Name: "dy", Tensor: randTensor(2, 4, 8)}); err != nil {
		t.Fatal(err)
	}
	if maxDiff(fwd().Data, x.Data) == 0 {
		t.Fatal("the expert did not learn away from the identity")
	}
}

// Malformed, oversized and mismatched requests are rejected with an error
// and the server keeps serving.
func TestRejectsBadRequests(t *testing.T) {
	e := newEnv(t)
	s, err := New(Config{Transport: e.srv, Experts: []string{"ffn.0"}, Hidden: 8, MaxBatch: 16, Limits: wire.Limits{MaxElements: 16 * 8}})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	good, _ := moe.EncodeRequest("ffn.0", []wire.Named{{Name: "x", Tensor: randTensor(1, 2, 8)}}, wire.Options{})
	nan := randTensor(1, 2, 8)
	nan.Data[3] = float32(math.NaN())
	cases := map[string][]byte{
		"garbage":   []byte("not a request"),
		"truncated": good[:len(good)-3],
		"oversized": must(moe.EncodeRequest("ffn.0", []wire.Named{{Name: "x", Tensor: randTensor(1, 17, 8)}}, wire.Options{})),
		"shape":     must(moe.EncodeRequest("ffn.0", []wire.Named{{Name: "x", Tensor: randTensor(1, 2, 7)}}, wire.Options{})),
		"rank":      must(moe.EncodeRequest("ffn.0", []wire.Named{{Name: "x", Tensor: randTensor(1, 2, 2, 8)}}, wire.Options{})),
		"missing":   must(moe.EncodeRequest("ffn.0", []wire.Named{{Name: "y", Tensor: randTensor(1, 2, 8)}}, wire.Options{})),
		"nan":       must(moe.EncodeRequest("ffn.0", []wire.Named{{Name: "x", Tensor: nan}}, wire.Options{})),
		"unknown":   must(moe.EncodeRequest("ffn.9", []wire.Named{{Name: "x", Tensor: randTensor(1, 2, 8)}}, wire.Options{})),
	}
	for name, req := range cases {
		_, err := e.client.Call(ctx, e.srv.AddrInfo(), moe.ForwardProtocol, req)
		var re *p2p.RemoteError
		if !errors.As(err, &re) {
			t.Errorf("%s: got %v, want a remote error", name, err)
		}
	}
	// Backward with mismatched shapes.
	_, err = e.call(ctx, moe.BackwardProtocol, "ffn.0", wire.Named{Name: "x", Tensor: randTensor(1, 2, 8)}, wire.Named{Name: "dy", Tensor: randTensor(1, 3, 8)})
	if err == nil || !strings.Contains(err.Error(), "ffn.0") {
		t.Errorf("mismatched backward: %v", err)
	}
	if _, err := e.client.Call(ctx, e.srv.AddrInfo(), moe.ForwardProtocol, good); err != nil {
		t.Fatalf("server stopped serving after bad requests: %v", err)
	}
	if s.Stats().Experts[0].Forward.Errors == 0 {
		t.Fatal("errors not counted")
	}
}

func must(b []byte, err error) []byte {
	if err != nil {
		panic(err)
	}
	return b
}

// Concurrent requests for one expert are processed in batches.
func TestBatching(t *testing.T) {
	e := newEnv(t)
	s, err := New(Config{Transport: e.srv, Experts: []string{"ffn.0", "ffn.1"}, Hidden: 16, MinBatch: 32, MaxBatch: 64, BatchTimeout: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	errs := make(chan error, 16)
	for i := range 16 {
		wg.Go(func() {
			x := randTensor(uint64(i), 4, 16)
			out, err := e.call(ctx, moe.ForwardProtocol, "ffn.0", wire.Named{Name: "x", Tensor: x})
			if err == nil && !slices.Equal(wire.Get(out, "y").Shape, x.Shape) {
				err = errors.New("bad shape")
			}
			errs <- err
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	f := s.Stats().Experts[0].Forward
	if f.Requests != 16 || f.Rows != 64 || f.Batches > 3 || f.MaxBatch < 32 {
		t.Fatalf("16 requests of 4 rows with MinBatch 32 ran as %d batches (max %d rows)", f.Batches, f.MaxBatch)
	}
	if f.MeanLatency() <= 0 {
		t.Fatal("no latency recorded")
	}
}

// The runtime serves the pool with the oldest request first.
func TestOldestFirst(t *testing.T) {
	cfg := Config{MinBatch: 1, MaxBatch: 8, BatchTimeout: time.Millisecond, MaxQueue: 8}
	r := newRuntime(&cfg)
	a, b := newExpert("ffn.0", &cfg), newExpert("ffn.1", &cfg)
	now := time.Now()
	ctx := context.Background()
	x := tensor.New(1, 4)
	b.fwd.tasks = []*task{{ctx: ctx, x: x, enq: now.Add(-2 * time.Second)}}
	a.bwd.tasks = []*task{{ctx: ctx, x: x, enq: now.Add(-time.Second)}}
	a.fwd.tasks = []*task{{ctx: ctx, x: x, enq: now.Add(-3 * time.Second)}}
	r.queued = []*pool{b.fwd, a.bwd, a.fwd}
	for _, p := range r.queued {
		p.rows = 1
	}
	p, _, _ := r.next(now)
	if p != a.fwd {
		t.Fatal("oldest pool not first")
	}
	// a is busy now, so its backward pool waits although b's is younger.
	if p, _, _ := r.next(now); p != b.fwd {
		t.Fatal("busy expert not skipped")
	}
}

// A restarted server reloads its checkpoint and declares its experts again
// under its new address.
func TestRestartReloadsCheckpointAndRedeclares(t *testing.T) {
	n := memnet.NewNetwork()
	defer n.Close()
	boot, _ := n.NewPeer()
	bootDHT, err := dht.New(boot, dht.Config{RefreshInterval: -1, RepublishInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer bootDHT.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	path := filepath.Join(t.TempDir(), "experts.safetensors")
	// The server restarts with its identity (as with --identity): its
	// declarations are its own, which no other peer can take over until
	// they expire.
	priv, _, err := crypto.GenerateEd25519Key(crand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	start := func() (*Server, *memnet.Peer, *dht.Node) {
		p, err := n.AddPeer(priv)
		if err != nil {
			t.Fatal(err)
		}
		d, err := dht.New(p, dht.Config{RefreshInterval: -1, RepublishInterval: -1})
		if err != nil {
			t.Fatal(err)
		}
		if err := d.Bootstrap(ctx, []peer.AddrInfo{boot.AddrInfo()}); err != nil {
			t.Fatal(err)
		}
		s, err := New(Config{Transport: p, DHT: d, Experts: []string{"ffn.0.0", "ffn.0.1"}, Hidden: 8, LR: 0.05, Seed: 1,
			CheckpointPath: path, DeclareEvery: time.Hour, Expiration: time.Minute})
		if err != nil {
			t.Fatal(err)
		}
		return s, p, d
	}
	s1, p1, d1 := start()
	// Train expert ffn.0.1 a little.
	cl, _ := n.NewPeer()
	req := must(moe.EncodeRequest("ffn.0.1", []wire.Named{{Name: "x", Tensor: randTensor(1, 3, 8)}, {Name: "dy", Tensor: randTensor(2, 3, 8)}}, wire.Options{}))
	for range 3 {
		if _, err := cl.Call(ctx, p1.AddrInfo(), moe.BackwardProtocol, req); err != nil {
			t.Fatal(err)
		}
	}
	waitDeclared(t, ctx, bootDHT, "ffn.0.", "1", p1.ID())
	trained := s1.ExpertWeights("ffn.0.1")
	if err := s1.Close(); err != nil {
		t.Fatal(err)
	}
	d1.Close()
	p1.Close()

	s2, p2, d2 := start()
	defer d2.Close()
	defer s2.Close()
	for name, w := range trained {
		if d := maxDiff(w.Data, s2.ExpertWeights("ffn.0.1")[name].Data); d != 0 {
			t.Fatalf("%s differs by %g after restart", name, d)
		}
	}
	waitDeclaredAt(t, ctx, bootDHT, "ffn.0.", "1", p2.AddrInfo())
	waitDeclaredAt(t, ctx, bootDHT, "ffn.", "0", p2.AddrInfo())
	// The optimizer state came back too: one more step matches.
	if s2.experts["ffn.0.1"].opt.State().Step != 3 {
		t.Fatalf("optimizer step %d after restart, want 3", s2.experts["ffn.0.1"].opt.State().Step)
	}
}

// A server whose DHT node (a client-mode node, which stores nothing
// itself) has no peers yet cannot declare; once the node joins, the retry
// (after 1 s, not DeclareEvery) declares the experts.
func TestDeclarationRetriedSoon(t *testing.T) {
	n := memnet.NewNetwork()
	defer n.Close()
	boot, _ := n.NewPeer()
	bootDHT, err := dht.New(boot, dht.Config{RefreshInterval: -1, RepublishInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer bootDHT.Close()
	p, _ := n.NewPeer()
	d, err := dht.New(p, dht.Config{RefreshInterval: -1, RepublishInterval: -1, ClientMode: true})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	s, err := New(Config{Transport: p, DHT: d, Experts: []string{"ffn.0.0"}, Hidden: 4, DeclareEvery: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	deadline := time.Now().Add(5 * time.Second)
	for s.Stats().DeclareFailures == 0 {
		if time.Now().After(deadline) {
			t.Fatal("declaring without DHT peers did not fail")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if err := d.Bootstrap(ctx, []peer.AddrInfo{boot.AddrInfo()}); err != nil {
		t.Fatal(err)
	}
	wctx, wcancel := context.WithTimeout(ctx, 5*time.Second)
	defer wcancel()
	waitDeclared(t, wctx, bootDHT, "ffn.0.", "0", p.ID())
}

func waitDeclared(t *testing.T, ctx context.Context, d *dht.Node, key, sub string, want peer.ID) {
	t.Helper()
	waitDeclaredAt(t, ctx, d, key, sub, peer.AddrInfo{ID: want})
}

// waitDeclaredAt waits for a declaration by want.ID, at want.Addrs if given.
func waitDeclaredAt(t *testing.T, ctx context.Context, d *dht.Node, key, sub string, want peer.AddrInfo) {
	t.Helper()
	for ctx.Err() == nil {
		items, err := d.Get(ctx, key)
		if err == nil {
			if it, ok := items[sub]; ok {
				info, err := moe.UnmarshalInfo(it.Value)
				if err == nil && info.Peer.ID == want.ID && (len(want.Addrs) == 0 || slices.EqualFunc(info.Peer.Addrs, want.Addrs, func(a, b ma.Multiaddr) bool { return a.Equal(b) })) {
					return
				}
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("%s/%s never declared by %s", key, sub, want)
}

// Lazy experts hold no weights until their first request.
func TestLazyAndSimulatedFailures(t *testing.T) {
	e := newEnv(t)
	s, err := New(Config{Transport: e.srv, Experts: []string{"ffn.0", "ffn.1"}, Hidden: 8, Lazy: true, FailRate: 0.5, Seed: 9})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if s.ExpertWeights("ffn.0") != nil {
		t.Fatal("lazy expert materialized early")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	fails := 0
	for range 40 {
		if _, err := e.call(ctx, moe.ForwardProtocol, "ffn.0", wire.Named{Name: "x", Tensor: randTensor(1, 2, 8)}); err != nil {
			if !strings.Contains(err.Error(), "simulated failure") {
				t.Fatal(err)
			}
			fails++
		}
	}
	if fails < 8 || fails > 32 {
		t.Fatalf("%d of 40 requests failed at FailRate 0.5", fails)
	}
	if s.ExpertWeights("ffn.0") == nil || s.ExpertWeights("ffn.1") != nil {
		t.Fatal("lazy materialization wrong")
	}
}

// TestNewContextStopsSetup checks that a server whose setup is interrupted
// stops creating experts and returns the context's error at once.
func TestNewContextStopsSetup(t *testing.T) {
	e := newEnv(t)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	uids, err := moe.ParseExperts("ffn.[0:64].[0:64]", 1<<16)
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	s, err := NewContext(ctx, Config{Transport: e.srv, Experts: uids, Hidden: 256})
	if !errors.Is(err, context.Canceled) {
		if s != nil {
			s.Close()
		}
		t.Fatalf("NewContext with a cancelled context: %v, want context.Canceled", err)
	}
	if d := time.Since(start); d > time.Second {
		t.Fatalf("interrupted setup took %v", d)
	}
}

// TestExpertParams checks the parameter count the server estimates memory
// from against the modules BuildExpert builds.
func TestExpertParams(t *testing.T) {
	for _, typ := range []string{TypeFFN, TypeTransformer} {
		for _, h := range []int{8, 64} {
			m := BuildExpert(typ, h, 2, rand.New(rand.NewPCG(1, 1)))
			var n int64
			for _, p := range m.Params() {
				n += int64(p.Value.Len())
			}
			if got := ExpertParams(typ, h); got != n {
				t.Errorf("ExpertParams(%s, %d) = %d, the module has %d", typ, h, got, n)
			}
		}
	}
}
