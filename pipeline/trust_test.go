package pipeline

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/core/protocol"

	"github.com/skyhive/skyhive/alloc"
	"github.com/skyhive/skyhive/p2p"
	"github.com/skyhive/skyhive/p2p/memnet"
	"github.com/skyhive/skyhive/tensor"
	"github.com/skyhive/skyhive/wire"
)

// totalAlloc is the bytes the process has allocated so far.
func totalAlloc() uint64 {
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.TotalAlloc
}

// hugeFrame is what an attacker claims: a 512 MiB message, the old bound.
const hugeFrame = 512 << 20

// TestExhaustedWorkerAttack: a stranger opens many activation and control
// streams to a worker on real (loopback) libp2p hosts, each claiming a
// 512 MiB message, and sends a large plain call. Every one is refused
// before its body is allocated, the process allocates far less than a
// single claimed frame, and the worker keeps answering its coordinator.
func TestExhaustedWorkerAttack(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := NewCoordinator(ctx, CoordinatorConfig{})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	w, err := NewWorker(ctx, WorkerConfig{Name: "victim", Join: c.Addrs()[0], Heartbeat: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	defer wg.Wait()
	defer w.Close()
	wg.Go(func() { w.Run(ctx) })
	if err := c.WaitWorkers(ctx, 1); err != nil {
		t.Fatal(err)
	}
	stranger, err := p2p.New(ctx, p2p.Config{ListenAddrs: []string{"/ip4/127.0.0.1/tcp/0"}})
	if err != nil {
		t.Fatal(err)
	}
	defer stranger.Close()
	victim := w.tr.AddrInfo()
	if err := stranger.Connect(ctx, victim); err != nil {
		t.Fatal(err)
	}

	before := totalAlloc()
	const streams = 10
	errs := make([]error, 2*streams)
	var attack sync.WaitGroup
	for i := range 2 * streams {
		attack.Go(func() {
			proto := ProtoActs
			if i >= streams {
				proto = ProtoControl
			}
			errs[i] = stranger.CallStream(ctx, victim, proto, func(wr io.Writer) error {
				if proto == ProtoControl {
					if _, err := wr.Write(append([]byte{byte(len(ProtoSetup))}, ProtoSetup...)); err != nil {
						return err
					}
				}
				if _, err := wr.Write(binary.BigEndian.AppendUint32(nil, hugeFrame)); err != nil {
					return err
				}
				// Some of the claimed body; the victim must not wait for more.
				_, err := wr.Write(make([]byte, 64<<10))
				return err
			}, nil)
		})
	}
	attack.Wait()
	for i, err := range errs {
		var re *p2p.RemoteError
		if !errors.As(err, &re) {
			t.Fatalf("stream %d: %v, want the victim's refusal", i, err)
		}
		if !strings.Contains(re.Msg, "not a neighbour") && !strings.Contains(re.Msg, "coordinator only") {
			t.Fatalf("stream %d refused for the wrong reason: %v", i, re)
		}
	}
	if got := totalAlloc() - before; got > hugeFrame/4 {
		t.Fatalf("the attack made the process allocate %d MiB", got>>20)
	} else {
		t.Logf("%d refused streams claiming %d MiB each: %.1f MiB allocated in the process", 2*streams, hugeFrame>>20, float64(got)/(1<<20))
	}
	// A plain call carrying a large setup is cut off by the host's bound
	// on plain calls before it is read.
	_, err = stranger.Call(ctx, victim, ProtoSetup, make([]byte, callBytes+1))
	var re *p2p.RemoteError
	if !errors.As(err, &re) || !strings.Contains(re.Msg, "exceeds the limit") {
		t.Fatalf("plain call of %d bytes: %v, want refused by the victim's bound", callBytes+1, err)
	}
	// The worker still serves its coordinator over control streams.
	if _, err := c.call(ctx, 0, ProtoAbort, abortReq{Gen: 1}, nil, nil, wire.Limits{}); err != nil {
		t.Fatalf("coordinator's call after the attack: %v", err)
	}
	if err := c.ping(ctx, 0, 5*time.Second); err != nil {
		t.Fatalf("coordinator's ping after the attack: %v", err)
	}
}

// TestActFrameBoundedByStage: a neighbour's activation stream may claim
// at most one micro-batch of the stage's real shape; a larger claim is
// refused before allocation and fails the running iteration.
func TestActFrameBoundedByStage(t *testing.T) {
	ids := testIDs(t, 2)
	w := &Worker{box: newInbox(0, []int{48}, []int{10}), prev: ids[0], next: ids[1], gen: 3}
	w.box.rows = 30
	ictx, cancelIter := context.WithCancelCause(context.Background())
	w.cancelIter = cancelIter
	fwd, bwd := w.box.frameBytes(false), w.box.frameBytes(true)
	if want := int64(30 * 48 * 4); fwd < want || fwd > want+2048 {
		t.Fatalf("forward frame bound %d, want about %d", fwd, want)
	}
	if want := int64(30 * 10 * 4); bwd < want || bwd > want+2048 {
		t.Fatalf("backward frame bound %d, want about %d", bwd, want)
	}
	before := totalAlloc()
	stream := io.MultiReader(bytes.NewReader(binary.BigEndian.AppendUint32(nil, hugeFrame)), zeros{})
	err := w.onActs(context.Background(), ids[0], stream, nil)
	if !errors.Is(err, errMsg) || !strings.Contains(err.Error(), fmt.Sprint(fwd)) {
		t.Fatalf("huge frame from the neighbour: %v", err)
	}
	if got := totalAlloc() - before; got > 1<<20 {
		t.Fatalf("refusing the frame allocated %d bytes", got)
	}
	if context.Cause(ictx) == nil {
		t.Fatal("the running iteration was not failed")
	}
	// One byte over the bound is refused; a frame within it is read (and
	// then refused for its content, which is garbage).
	over := io.MultiReader(bytes.NewReader(binary.BigEndian.AppendUint32(nil, uint32(bwd+1))), zeros{})
	if err := w.onActs(context.Background(), ids[1], over, nil); err == nil || !strings.Contains(err.Error(), "at most") {
		t.Fatalf("frame one byte over the bound: %v", err)
	}
	within := io.MultiReader(bytes.NewReader(binary.BigEndian.AppendUint32(nil, uint32(bwd))), io.LimitReader(zeros{}, bwd))
	if err := w.onActs(context.Background(), ids[1], within, nil); err == nil || strings.Contains(err.Error(), "at most") {
		t.Fatalf("garbage frame within the bound: %v", err)
	}
	// A stranger is refused before a byte is read.
	r := &countReader{r: zeros{}}
	if err := w.onActs(context.Background(), testIDs(t, 1)[0], r, nil); err == nil || r.n != 0 {
		t.Fatalf("stranger's stream: %v after reading %d bytes", err, r.n)
	}
}

type zeros struct{}

func (zeros) Read(p []byte) (int, error) {
	clear(p)
	return len(p), nil
}

type countReader struct {
	r io.Reader
	n int
}

func (c *countReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += n
	return n, err
}

func testIDs(t testing.TB, n int) []peer.ID {
	t.Helper()
	net := memnet.NewNetwork()
	defer net.Close()
	out := make([]peer.ID, n)
	for i := range out {
		p, err := net.NewPeer()
		if err != nil {
			t.Fatal(err)
		}
		out[i] = p.ID()
	}
	return out
}

// twoStagePlan splits deep-mlp:48x4 over workers 0 and 1.
var twoStagePlan = alloc.Plan{Stages: []alloc.Stage{{Device: 0, First: 0, Last: 4}, {Device: 1, First: 4, Last: 9}}}

// twoStages starts a session of two stages on an in-memory network.
func twoStages(t *testing.T, ctx context.Context) (*cluster, *Session) {
	t.Helper()
	cl := newCluster(t, 1, 1)
	s, err := cl.c.Start(ctx, SessionConfig{
		Model: "deep-mlp:48x4", Seed: 11, Batch: 30, Micro: 2, Schedule: GPipe, Optim: OptimConfig{LR: 1e-2},
		Strategy: "even", // re-plans keep two stages
		Plan:     &twoStagePlan, ProfileReps: 1, MaxRecoveries: 1, Log: testLog{t},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	return cl, s
}

// testLog writes a session's events to the test log.
type testLog struct{ t *testing.T }

func (l testLog) Write(p []byte) (int, error) {
	l.t.Log(strings.TrimSpace(string(p)))
	return len(p), nil
}

// TestControlFromStrangerRefused: every call only the coordinator may
// make, and activations, are refused from a stranger; the stage is
// untouched and the pipeline keeps training.
func TestControlFromStrangerRefused(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cl, s := twoStages(t, ctx)
	bs := batches(t, blobs(t, 120, 4), 30, 2)
	if _, err := s.Step(ctx, bs[0]); err != nil {
		t.Fatal(err)
	}
	stranger, err := cl.net.NewPeer()
	if err != nil {
		t.Fatal(err)
	}
	victim := cl.workers[0]
	msg := func(hdr any, ts []wire.Named) []byte {
		b, err := encodeMsg(hdr, ts)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	calls := map[protocol.ID][]byte{
		ProtoSetup:    msg(setupReq{Gen: 1 << 40, Stage: -1}, nil), // would release the stage
		ProtoIter:     msg(iterReq{Gen: s.gen, Iter: s.iter, Schedule: GPipe, Sizes: []int{15, 15}}, nil),
		ProtoCommit:   msg(commitReq{Gen: s.gen, Iter: s.iter - 1, LR: 1, Scale: 1}, nil),
		ProtoAbort:    msg(abortReq{Gen: s.gen, Iter: s.iter}, nil),
		ProtoFetch:    msg(fetchReq{Gen: s.gen}, nil),
		ProtoProfile:  msg(profileReq{Model: "deep-mlp:48x4", Batch: 1, Reps: 1}, nil),
		ProtoProbe:    msg(probeReq{Peer: refOf(stranger.AddrInfo())}, nil),
		ProtoShutdown: nil,
		ProtoAct:      msg(actMsg{Gen: s.gen, Iter: s.iter}, []wire.Named{{Name: "t", Tensor: tensor.New(15, 48)}}),
	}
	for proto, b := range calls {
		_, err := stranger.Call(ctx, victim.tr.AddrInfo(), proto, b)
		var re *p2p.RemoteError
		if !errors.As(err, &re) || (!strings.Contains(re.Msg, "coordinator only") && !strings.Contains(re.Msg, "not a neighbour")) {
			t.Fatalf("%s from a stranger: %v, want refused", proto, err)
		}
	}
	if victim.stopped() {
		t.Fatal("a stranger's shutdown stopped the worker")
	}
	if _, err := s.Step(ctx, bs[1]); err != nil {
		t.Fatalf("training after the stranger's calls: %v", err)
	}
}

// TestRegistrationFlood: 1,024 fake workers register; the coordinator
// keeps DefaultMaxWorkers of them, refuses the rest with
// ErrCoordinatorFull, counts a peer that registers again once, and gives
// the place of a fake that died before being profiled to a newcomer.
func TestRegistrationFlood(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	net := memnet.NewNetwork()
	defer net.Close()
	cp, err := net.NewPeer()
	if err != nil {
		t.Fatal(err)
	}
	c, err := NewCoordinator(ctx, CoordinatorConfig{Transport: cp})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	req, err := encodeMsg(registerReq{Name: "fake", Slowdown: 1}, nil)
	if err != nil {
		t.Fatal(err)
	}
	register := func(p *memnet.Peer) (int, error) {
		b, err := p.Call(ctx, cp.AddrInfo(), ProtoRegister, req)
		if err != nil {
			return -1, err
		}
		var r registerResp
		return r.Index, decodeHeader(b, &r)
	}
	var fakes []*memnet.Peer
	accepted, full := 0, 0
	for range 1024 {
		p, err := net.NewPeer()
		if err != nil {
			t.Fatal(err)
		}
		fakes = append(fakes, p)
		switch _, err := register(p); {
		case err == nil:
			accepted++
		case strings.Contains(err.Error(), ErrCoordinatorFull.Error()):
			full++
		default:
			t.Fatalf("registration %d: %v", len(fakes), err)
		}
	}
	if accepted != DefaultMaxWorkers || full != 1024-DefaultMaxWorkers || len(c.Workers()) != DefaultMaxWorkers {
		t.Fatalf("accepted %d, refused %d, table of %d; want %d accepted", accepted, full, len(c.Workers()), DefaultMaxWorkers)
	}
	// Registering again keeps one place per peer.
	if idx, err := register(fakes[7]); err != nil || idx != 7 || len(c.Workers()) != DefaultMaxWorkers {
		t.Fatalf("second registration of fake 7: index %d, %v, table of %d", idx, err, len(c.Workers()))
	}
	// Profiling marks fakes dead (they do not answer); a place of one that
	// was never profiled is freed, one that holds a measured speed is not.
	c.setSpeed(3, 1e9)
	c.markDead(3)
	c.markDead(5)
	newcomer, err := net.NewPeer()
	if err != nil {
		t.Fatal(err)
	}
	if idx, err := register(newcomer); err != nil || idx != 5 {
		t.Fatalf("newcomer after a fake died unprofiled: index %d, %v; want 5", idx, err)
	}
	late, err := net.NewPeer()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := register(late); err == nil || !strings.Contains(err.Error(), ErrCoordinatorFull.Error()) {
		t.Fatalf("registration with only a profiled dead worker's place: %v, want full", err)
	}
	if n := len(c.Workers()); n != DefaultMaxWorkers {
		t.Fatalf("table of %d workers", n)
	}
}

// TestInboxRefusesBadActivations: a tensor that is off in any dimension,
// has more examples than a micro-batch, or holds NaN or Inf is refused.
func TestInboxRefusesBadActivations(t *testing.T) {
	b := newInbox(0, []int{4, 3}, []int{5})
	b.rows = 8
	good := func(n int, shape ...int) *tensor.Tensor { return tensor.New(append([]int{n}, shape...)...) }
	micro := 0
	put := func(backward bool, x *tensor.Tensor) error {
		micro++
		return b.put(actKey{micro: micro, backward: backward}, x)
	}
	if err := put(false, good(8, 4, 3)); err != nil {
		t.Fatalf("good forward: %v", err)
	}
	if err := put(true, good(2, 5)); err != nil {
		t.Fatalf("good backward: %v", err)
	}
	bad := map[string]*tensor.Tensor{
		"rank low":    tensor.New(8, 12),
		"rank high":   tensor.New(8, 4, 3, 1),
		"no examples": tensor.New(0, 4, 3),
		"too many":    good(9, 4, 3),
		"dim 1":       good(2, 5, 3),
		"dim 2":       good(2, 4, 2),
		"backward":    good(2, 5),
	}
	for name, x := range bad {
		if err := put(false, x); !errors.Is(err, errBadAct) {
			t.Fatalf("%s %v: %v, want refused", name, x.Shape, err)
		}
	}
	// The forward micro-batches of iteration 0 already hold the batch.
	if err := put(false, good(1, 4, 3)); !errors.Is(err, errBadAct) {
		t.Fatalf("examples over the batch: %v, want refused", err)
	}
	for _, v := range []float32{float32(math.NaN()), float32(math.Inf(1)), float32(math.Inf(-1))} {
		x := good(3, 4, 3)
		x.Data[7] = v
		if err := put(false, x); !errors.Is(err, errBadAct) {
			t.Fatalf("activation with %v: %v, want refused", v, err)
		}
		g := good(3, 5)
		g.Data[14] = v
		if err := put(true, g); !errors.Is(err, errBadAct) {
			t.Fatalf("gradient with %v: %v, want refused", v, err)
		}
	}
}

// corrupting wraps a worker's dialer so that what it sends is changed by
// f.
func corrupting(d actDialer, f func(*tensor.Tensor) *tensor.Tensor) actDialer {
	return func(ctx context.Context, to peer.AddrInfo, req iterReq, backward bool, m int, fail context.CancelCauseFunc) actSender {
		return corruptSender{d(ctx, to, req, backward, m, fail), f}
	}
}

type corruptSender struct {
	actSender
	f func(*tensor.Tensor) *tensor.Tensor
}

func (s corruptSender) send(micro int, t *tensor.Tensor) { s.actSender.send(micro, s.f(t)) }

// TestPoisonedActivationsRefused: a stage that sends NaN, Inf or a tensor
// of the wrong shape to its neighbour makes the iteration fail like a
// failed stage; the weights stay as they were, and training goes on once
// the stage behaves.
func TestPoisonedActivationsRefused(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 40*time.Second)
	defer cancel()
	cl, s := twoStages(t, ctx)
	bs := batches(t, blobs(t, 120, 4), 30, 2)
	if _, err := s.Step(ctx, bs[0]); err != nil {
		t.Fatal(err)
	}
	honest := [2]actDialer{cl.workers[0].dial, cl.workers[1].dial}
	poisons := []struct {
		name string
		f    func(*tensor.Tensor) *tensor.Tensor
	}{
		{"nan", func(x *tensor.Tensor) *tensor.Tensor {
			y := x.Clone()
			y.Data[len(y.Data)/2] = float32(math.NaN())
			return y
		}},
		{"inf", func(x *tensor.Tensor) *tensor.Tensor {
			y := x.Clone()
			y.Data[0] = float32(math.Inf(-1))
			return y
		}},
		{"shape", func(x *tensor.Tensor) *tensor.Tensor {
			return tensor.New(x.Shape[0], x.Shape[1]+1)
		}},
	}
	for _, p := range poisons {
		name, poison := p.name, p.f
		for k := range 2 { // forward from stage 0, backward from stage 1
			// Recovery may have re-planned onto one stage; poison on two.
			if err := s.SetPlan(ctx, twoStagePlan); err != nil {
				t.Fatal(err)
			}
			before, err := s.Snapshot(ctx)
			if err != nil {
				t.Fatal(err)
			}
			cl.workers[k].dial = corrupting(honest[k], poison)
			st, err := s.Step(ctx, bs[1])
			cl.workers[k].dial = honest[k]
			after, serr := s.Snapshot(ctx)
			if serr != nil {
				t.Fatal(serr)
			}
			if err == nil || !strings.Contains(err.Error(), "bad activation") {
				t.Fatalf("%s from stage %d: step %v (event %q), want refused as a bad activation", name, k, err, st.Event)
			}
			// Refused on every attempt (recovery re-installs the same
			// plan and retries): nothing was committed.
			for n, p := range before.Params {
				if !slicesEqual(p.Data, after.Params[n].Data) {
					t.Fatalf("%s from stage %d changed weights %s", name, k, n)
				}
			}
			for n, p := range after.Params {
				for _, v := range p.Data {
					if math.IsNaN(float64(v)) || math.IsInf(float64(v), 0) {
						t.Fatalf("%s from stage %d: weights %s hold %v", name, k, n, v)
					}
				}
			}
		}
	}
	st, err := s.Step(ctx, bs[1])
	if err != nil {
		t.Fatalf("honest step after the poisoned ones: %v", err)
	}
	if math.IsNaN(st.Loss) || math.IsInf(st.Loss, 0) {
		t.Fatalf("loss %v", st.Loss)
	}
}

func slicesEqual(a, b []float32) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if math.Float32bits(a[i]) != math.Float32bits(b[i]) {
			return false
		}
	}
	return true
}

// FuzzDecodeMsg feeds arbitrary bytes to the message decoders, as a
// stranger or a broken neighbour could: they must refuse or decode within
// the limits, never panic.
func FuzzDecodeMsg(f *testing.F) {
	act, _ := encodeMsg(actMsg{Gen: 1, Iter: 2, Micro: 3}, []wire.Named{{Name: "t", Tensor: tensor.New(2, 3)}})
	reg, _ := encodeMsg(registerReq{Name: "w", Slowdown: 1}, nil)
	f.Add(act)
	f.Add(reg)
	f.Add([]byte{0, 0, 0, 2, '{', '}', 'S', 'K', 'M', 1, 1, 0})
	f.Add([]byte{0xff, 0xff, 0xff, 0xff})
	box := newInbox(0, []int{3}, []int{3})
	box.rows = 4
	f.Fuzz(func(t *testing.T, b []byte) {
		var m actMsg
		lim := box.limits(false)
		if ts, err := decodeMsg(b, &m, lim); err == nil {
			n := 0
			for _, x := range ts {
				n += x.Tensor.Len()
			}
			if len(ts) > lim.MaxTensors || n > lim.MaxElements {
				t.Fatalf("decoded %d tensors of %d values over %+v", len(ts), n, lim)
			}
			if len(ts) == 1 {
				_ = box.put(actKey{iter: m.Iter, micro: m.Micro, backward: m.Backward}, ts[0].Tensor)
			}
		}
		var r registerReq
		_ = decodeHeader(b, &r)
	})
}

// FuzzActStream feeds arbitrary bytes as a neighbour's activation stream
// and as a coordinator's control stream: every length is checked before
// anything is allocated, nothing panics.
func FuzzActStream(f *testing.F) {
	act, _ := encodeMsg(actMsg{Gen: 1, Micro: 1}, []wire.Named{{Name: "t", Tensor: tensor.New(2, 3)}})
	f.Add(append(binary.BigEndian.AppendUint32(nil, uint32(len(act))), act...))
	f.Add(binary.BigEndian.AppendUint32(nil, hugeFrame))
	f.Add(append([]byte{byte(len(ProtoAbort))}, ProtoAbort...))
	ids := testIDs(f, 2)
	f.Fuzz(func(t *testing.T, b []byte) {
		w := &Worker{box: newInbox(0, []int{3}, []int{3}), prev: ids[0], next: ids[1], gen: 1, coord: peer.AddrInfo{ID: ids[0]}, stop: make(chan struct{})}
		w.box.rows = 4
		w.cfg.MaxMessageBytes = 1 << 20
		w.controls = map[protocol.ID]controlHandler{ProtoAbort: w.onAbort}
		before := totalAlloc()
		_ = w.onActs(context.Background(), ids[0], bytes.NewReader(b), nil)
		_ = w.onControl(context.Background(), ids[0], bytes.NewReader(b), io.Discard)
		if got := totalAlloc() - before; got > uint64(64*len(b)+1<<20) {
			t.Fatalf("%d input bytes made %d bytes allocated", len(b), got)
		}
	})
}

// TestImpossibleReportsRefused: a stage whose iteration report or fetched
// state is impossible (a negative squared gradient norm; NaN weights) is
// handled like a failed stage: nothing is committed, and its state does
// not reach the snapshot.
func TestImpossibleReportsRefused(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cl, s := twoStages(t, ctx)
	bs := batches(t, blobs(t, 120, 4), 30, 2)
	if _, err := s.Step(ctx, bs[0]); err != nil {
		t.Fatal(err)
	}
	w := cl.workers[1]
	lying := func(ctx context.Context, from peer.ID, b []byte) ([]byte, error) {
		out, err := w.onIter(ctx, b)
		if err != nil {
			return nil, err
		}
		var r iterResp
		if err := decodeHeader(out, &r); err != nil {
			return nil, err
		}
		r.GradSq = -1 // would turn the clipping scale into NaN
		return encodeMsg(r, nil)
	}
	before, err := s.Snapshot(ctx)
	if err != nil {
		t.Fatal(err)
	}
	w.tr.SetHandler(ProtoIter, lying)
	_, err = s.Step(ctx, bs[1])
	w.control(ProtoIter, w.onIter)
	if err == nil || !strings.Contains(err.Error(), "impossible report") {
		t.Fatalf("step with a stage reporting a negative squared norm: %v", err)
	}
	after, err := s.Snapshot(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for n, p := range before.Params {
		if !slicesEqual(p.Data, after.Params[n].Data) {
			t.Fatalf("the refused iteration changed weights %s", n)
		}
	}
	if _, err := s.Step(ctx, bs[1]); err != nil {
		t.Fatalf("honest step afterwards: %v", err)
	}

	// NaN weights on a stage are refused when fetched.
	w.runMu.Lock()
	w.st.params[0].Value.Data[0] = float32(math.NaN())
	w.runMu.Unlock()
	if _, err := s.Snapshot(ctx); err == nil || !strings.Contains(err.Error(), "NaN") {
		t.Fatalf("snapshot of a stage holding NaN: %v", err)
	}
}
