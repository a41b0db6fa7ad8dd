package server

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"log/slog"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/skyhive/skyhive/checkpoint"
	"github.com/skyhive/skyhive/moe"
	"github.com/skyhive/skyhive/p2p"
	"github.com/skyhive/skyhive/tensor"
	"github.com/skyhive/skyhive/wire"
)

// filled returns a tensor of the given shape holding v everywhere.
func filled(v float32, shape ...int) *tensor.Tensor {
	t := tensor.New(shape...)
	for i := range t.Data {
		t.Data[i] = v
	}
	return t
}

// with returns a copy of t with t.Data[i] = v.
func with(t *tensor.Tensor, i int, v float32) *tensor.Tensor {
	c := t.Clone()
	c.Data[i] = v
	return c
}

func weightsEqual(a, b map[string]*tensor.Tensor) bool {
	if len(a) != len(b) {
		return false
	}
	for name, t := range a {
		if b[name] == nil || maxDiff(t.Data, b[name].Data) != 0 {
			return false
		}
	}
	return true
}

func expectRemote(t *testing.T, name string, err error, want string) {
	t.Helper()
	var re *p2p.RemoteError
	if !errors.As(err, &re) {
		t.Errorf("%s: got %v, want a remote error", name, err)
		return
	}
	if want != "" && !strings.Contains(err.Error(), want) {
		t.Errorf("%s: error %q does not mention %q", name, err, want)
	}
}

// Poisoned forward inputs and backward gradients (3e38, NaN, Inf, wrong
// rank, hidden size or row count) are refused, the expert's weights stay
// exactly as they were, an honest client is served afterwards and a
// checkpoint holds finite weights.
func TestPoisonedRequestsRefused(t *testing.T) {
	e := newEnv(t)
	path := filepath.Join(t.TempDir(), "experts.safetensors")
	s, err := New(Config{Transport: e.srv, Experts: []string{"ffn.0"}, Hidden: 8, LR: 0.01, Seed: 3, MaxBatch: 16, CheckpointPath: path})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	x, dy := randTensor(1, 4, 8), randTensor(2, 4, 8)
	nan, inf := float32(math.NaN()), float32(math.Inf(1))
	before := s.ExpertWeights("ffn.0")
	for name, c := range map[string]struct{ x, dy *tensor.Tensor }{
		"dy 3e38":        {x, filled(3e38, 4, 8)},
		"dy -3e38":       {x, with(dy, 5, -3e38)},
		"dy above bound": {x, with(dy, 0, 2*DefaultMaxAbsValue)},
		"dy NaN":         {x, with(dy, 7, nan)},
		"dy Inf":         {x, with(dy, 7, inf)},
		"x 3e38":         {filled(3e38, 4, 8), dy},
		"x NaN":          {with(x, 1, nan), dy},
		"x -Inf":         {with(x, 1, -inf), dy},
		"dy rank":        {x, randTensor(2, 4, 8, 1)},
		"dy hidden":      {x, randTensor(2, 4, 7)},
		"dy rows":        {x, randTensor(2, 5, 8)},
		"x hidden":       {randTensor(1, 4, 9), randTensor(2, 4, 9)},
		"x rows":         {randTensor(1, 17, 8), randTensor(2, 17, 8)},
		"dy missing":     {x, nil},
	} {
		msg := []wire.Named{{Name: "x", Tensor: c.x}}
		if c.dy != nil {
			msg = append(msg, wire.Named{Name: "dy", Tensor: c.dy})
		}
		_, err := e.call(ctx, moe.BackwardProtocol, "ffn.0", msg...)
		expectRemote(t, "backward "+name, err, "")
		if c.dy == nil || c.dy == dy {
			_, err := e.call(ctx, moe.ForwardProtocol, "ffn.0", wire.Named{Name: "x", Tensor: c.x})
			if c.x != x {
				expectRemote(t, "forward "+name, err, "ffn.0")
			}
		}
	}
	if !weightsEqual(before, s.ExpertWeights("ffn.0")) {
		t.Fatal("refused requests changed the expert")
	}
	if st := s.Stats().Experts[0]; st.Updates != 0 || st.Backward.Errors != 14 || st.Forward.Errors != 3 {
		t.Fatalf("stats after refused requests: %+v", st)
	}
	// The server still serves an honest client, and learns from it.
	out, err := e.call(ctx, moe.BackwardProtocol, "ffn.0", wire.Named{Name: "x", Tensor: x}, wire.Named{Name: "dy", Tensor: dy})
	if err != nil {
		t.Fatalf("honest backward after the attack: %v", err)
	}
	if dx := wire.Get(out, "dx"); dx == nil || !allFinite(dx.Data) {
		t.Fatalf("honest backward answered %v", out)
	}
	if weightsEqual(before, s.ExpertWeights("ffn.0")) {
		t.Fatal("honest backward did not update the expert")
	}
	if err := s.Save(path); err != nil {
		t.Fatal(err)
	}
	f, err := checkpoint.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	if len(f.Tensors) == 0 || !tensorsFinite(f.Tensors) {
		t.Fatalf("checkpoint after the attack holds %d tensors, finite %v", len(f.Tensors), tensorsFinite(f.Tensors))
	}
}

// With the value bound lifted, 3e38 gradients reach the expert: the bias
// gradient (a sum over rows) overflows to Inf. The step is skipped,
// counted and logged, the weights stay bit for bit as they were, the
// caller gets an error instead of a non-finite dx, and honest steps
// continue. Before this guard, the same call turned the weights into NaN.
func TestNonFiniteStepSkipped(t *testing.T) {
	for _, stepRows := range []int{1, 6} {
		e := newEnv(t)
		var logs bytes.Buffer
		s, err := New(Config{Transport: e.srv, Experts: []string{"ffn.0"}, Hidden: 8, LR: 0.01, Seed: 3, StepRows: stepRows,
			MaxAbsValue: math.MaxFloat32, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		x, dy := randTensor(1, 4, 8), randTensor(2, 4, 8)
		before := s.ExpertWeights("ffn.0")
		if stepRows > 1 {
			// An honest batch is pending when the poisoned one arrives:
			// the whole accumulation is dropped, not applied.
			if _, err := e.call(ctx, moe.BackwardProtocol, "ffn.0", wire.Named{Name: "x", Tensor: x}, wire.Named{Name: "dy", Tensor: dy}); err != nil {
				t.Fatal(err)
			}
		}
		out, err := e.call(ctx, moe.BackwardProtocol, "ffn.0", wire.Named{Name: "x", Tensor: x}, wire.Named{Name: "dy", Tensor: filled(3e38, 4, 8)})
		if err != nil {
			expectRemote(t, "3e38 backward", err, "non-finite")
		} else if dx := wire.Get(out, "dx"); dx == nil || !allFinite(dx.Data) {
			t.Fatalf("3e38 backward answered %v", out)
		}
		if !weightsEqual(before, s.ExpertWeights("ffn.0")) {
			t.Fatalf("StepRows %d: a non-finite step changed the weights", stepRows)
		}
		st := s.Stats().Experts[0]
		if st.SkippedSteps != 1 || st.Updates != 0 {
			t.Fatalf("StepRows %d: stats %+v, want 1 skipped step and no update", stepRows, st)
		}
		if !strings.Contains(logs.String(), "expert step skipped") {
			t.Fatalf("no log line for the skipped step: %q", logs.String())
		}
		for range 2 {
			if _, err := e.call(ctx, moe.BackwardProtocol, "ffn.0", wire.Named{Name: "x", Tensor: x}, wire.Named{Name: "dy", Tensor: dy}); err != nil {
				t.Fatalf("honest backward after the attack: %v", err)
			}
		}
		w := s.ExpertWeights("ffn.0")
		wantUpdates := int64(2) // two honest batches of 4 rows
		if stepRows > 1 {
			wantUpdates = 1
		}
		if st := s.Stats().Experts[0]; st.Updates != wantUpdates || weightsEqual(before, w) || !tensorsFinite(w) {
			t.Fatalf("StepRows %d: honest steps after the attack: %+v", stepRows, st)
		}
		cancel()
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
	}
}

// The crash of issue 13: a transformer expert of hidden 64 got a forward
// request of shape [1, 262144, 64], which only had its batch checked, and
// attention asked for 256 GiB. Now the sequence length is capped and the
// working memory estimated before anything runs: the request is refused
// with a clear error and the server keeps serving.
func TestTransformerOversizedSequenceRefused(t *testing.T) {
	e := newEnv(t)
	s, err := New(Config{Transport: e.srv, Experts: []string{"t.0"}, Type: TypeTransformer, Hidden: 64, Seed: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	// The request of the report announces [1, 262144, 64]. Its shape is
	// refused before its 64 MiB of data are read or allocated: the request
	// below is a [1, 7, 64] one with its sequence length rewritten and no
	// data at all, and the error is about the shape, not the truncation.
	small := must(moe.EncodeRequest("t.0", []wire.Named{{Name: "x", Tensor: tensor.New(1, 7, 64)}}, wire.Options{}))
	seqAt := 5 + len("t.0") + 6 + 2 + 8 + 4 // request header, uid, message header, name, tensor header, dim 0
	if binary.LittleEndian.Uint32(small[seqAt:]) != 7 {
		t.Fatal("test does not know where the wire format keeps the sequence length")
	}
	req := slices.Clone(small[:seqAt+8])
	binary.LittleEndian.PutUint32(req[seqAt:], 262144)
	_, err = e.client.Call(ctx, e.srv.AddrInfo(), moe.ForwardProtocol, req)
	expectRemote(t, "[1, 262144, 64]", err, "sequence length 262144, not in [1, 1024]")
	before := s.ExpertWeights("t.0")
	for name, x := range map[string]*tensor.Tensor{
		"seq over cap": randTensor(1, 1, DefaultMaxSeqLen+1, 64),
		"seq zero":     tensor.New(1, 0, 64),
		"hidden":       randTensor(1, 1, 8, 32),
		"rank 2":       randTensor(1, 8, 64),
		"rank 4":       randTensor(1, 1, 1, 8, 64),
	} {
		_, err := e.call(ctx, moe.ForwardProtocol, "t.0", wire.Named{Name: "x", Tensor: x})
		expectRemote(t, "forward "+name, err, "")
		_, err = e.call(ctx, moe.BackwardProtocol, "t.0", wire.Named{Name: "x", Tensor: x}, wire.Named{Name: "dy", Tensor: x})
		expectRemote(t, "backward "+name, err, "")
	}
	x := randTensor(3, 2, 16, 64)
	_, err = e.call(ctx, moe.BackwardProtocol, "t.0", wire.Named{Name: "x", Tensor: x}, wire.Named{Name: "dy", Tensor: filled(3e38, 2, 16, 64)})
	expectRemote(t, "backward 3e38", err, "")
	if !weightsEqual(before, s.ExpertWeights("t.0")) {
		t.Fatal("refused requests changed the expert")
	}
	out, err := e.call(ctx, moe.BackwardProtocol, "t.0", wire.Named{Name: "x", Tensor: x}, wire.Named{Name: "dy", Tensor: randTensor(4, 2, 16, 64)})
	if err != nil || wire.Get(out, "dx") == nil {
		t.Fatalf("honest backward after the attack: %v", err)
	}
	if w := s.ExpertWeights("t.0"); weightsEqual(before, w) || !tensorsFinite(w) {
		t.Fatal("honest backward did not update the expert or left it non-finite")
	}
}

// With the sequence cap lifted, the memory estimate still refuses a
// sequence whose attention weights do not fit the per-request budget, and
// the server's working memory is bounded by its budgets, not by requests.
func TestWorkingMemoryBudget(t *testing.T) {
	e := newEnv(t)
	s, err := New(Config{Transport: e.srv, Experts: []string{"t.0"}, Type: TypeTransformer, Hidden: 64, Seed: 1,
		MaxSeqLen: 1 << 20, RequestMemory: 32 << 20})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	// 2048² attention weights are 16 MiB per pass; backward keeps two
	// sets and the activations: over 32 MiB. Forward alone fits.
	x := randTensor(1, 1, 2048, 64)
	_, err = e.call(ctx, moe.BackwardProtocol, "t.0", wire.Named{Name: "x", Tensor: x}, wire.Named{Name: "dy", Tensor: x})
	expectRemote(t, "backward over budget", err, "working memory")
	_, err = e.call(ctx, moe.ForwardProtocol, "t.0", wire.Named{Name: "x", Tensor: randTensor(1, 1, 4096, 64)})
	expectRemote(t, "forward over budget", err, "working memory")
	// The estimate is checked on the shape alone, before the data is
	// read: a header announcing [1, 200000, 64] (150 GiB of attention
	// weights) without any data is refused for its memory, not for the
	// missing data.
	small := must(moe.EncodeRequest("t.0", []wire.Named{{Name: "x", Tensor: tensor.New(1, 7, 64)}}, wire.Options{}))
	seqAt := 5 + len("t.0") + 6 + 2 + 8 + 4
	req := slices.Clone(small[:seqAt+8])
	binary.LittleEndian.PutUint32(req[seqAt:], 200000)
	_, err = e.client.Call(ctx, e.srv.AddrInfo(), moe.ForwardProtocol, req)
	expectRemote(t, "[1, 200000, 64] header", err, "working memory")
	if _, err := e.call(ctx, moe.ForwardProtocol, "t.0", wire.Named{Name: "x", Tensor: randTensor(2, 1, 64, 64)}); err != nil {
		t.Fatalf("honest forward after refusals: %v", err)
	}
}

// Requests whose tensors would push the bytes queued or running over
// QueueMemory are refused as busy; the budget is released when requests
// finish, so later requests are served.
func TestQueueMemoryBudget(t *testing.T) {
	e := newEnv(t)
	s, err := New(Config{Transport: e.srv, Experts: []string{"ffn.0"}, Hidden: 8, QueueMemory: 4 * 8 * 64})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err = e.call(ctx, moe.ForwardProtocol, "ffn.0", wire.Named{Name: "x", Tensor: randTensor(1, 65, 8)})
	expectRemote(t, "over the queue budget", err, "busy")
	for range 3 {
		if _, err := e.call(ctx, moe.ForwardProtocol, "ffn.0", wire.Named{Name: "x", Tensor: randTensor(1, 64, 8)}); err != nil {
			t.Fatalf("a request within the budget: %v", err)
		}
	}
	s.rt.mu.Lock()
	held := s.rt.queuedBytes
	s.rt.mu.Unlock()
	if held != 0 {
		t.Fatalf("%d bytes still counted after every request finished", held)
	}
}

// A batch takes tasks only while their working memory fits RequestMemory.
func TestBatchWithinRequestMemory(t *testing.T) {
	cfg := Config{MinBatch: 1, MaxBatch: 100, BatchTimeout: time.Millisecond, MaxQueue: 8, RequestMemory: 250}
	r := newRuntime(&cfg)
	a := newExpert("ffn.0", &cfg)
	now := time.Now()
	for range 4 {
		a.fwd.tasks = append(a.fwd.tasks, &task{ctx: context.Background(), x: tensor.New(1, 4), enq: now.Add(-time.Second), work: 100, bytes: 16})
	}
	a.fwd.rows = 4
	r.queued = []*pool{a.fwd}
	r.queuedBytes = 64
	p, batch, _ := r.next(now)
	if p != a.fwd || len(batch) != 2 {
		t.Fatalf("batch of %d tasks of 100 bytes with a budget of 250", len(batch))
	}
}

// The estimate the budgets use covers what the layers themselves report as
// their activation memory, for both expert types.
func TestWorkBytesCoversActivations(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 1))
	for _, c := range []struct {
		typ    string
		hidden int
		shape  []int
	}{
		{TypeFFN, 16, []int{7, 16}},
		{TypeTransformer, 64, []int{3, 50, 64}},
		{TypeTransformer, 128, []int{2, 300, 128}},
	} {
		cfg := Config{Type: c.typ, Hidden: c.hidden, Heads: max(1, c.hidden/64)}
		m := BuildExpert(c.typ, c.hidden, cfg.Heads, rng)
		act := m.Cost(c.shape).ActivationBytes
		if fwd := cfg.workBytes(c.shape, false); fwd < act {
			t.Errorf("%s %v: forward estimate %d below the activations' %d bytes", c.typ, c.shape, fwd, act)
		}
		if bwd := cfg.workBytes(c.shape, true); bwd < 2*act {
			t.Errorf("%s %v: backward estimate %d below twice the activations' %d bytes", c.typ, c.shape, bwd, act)
		}
	}
	huge := Config{Type: TypeTransformer, Hidden: 1 << 16, Heads: 1 << 10}
	if got := huge.workBytes([]int{1 << 30, 1 << 30, 1 << 16}, true); got != math.MaxInt64 {
		t.Fatalf("estimate of an absurd shape wrapped around to %d", got)
	}
}

// A checkpoint never saves non-finite weights: an expert found poisoned
// (here by writing NaN into it directly, as a bug past every guard would)
// is rolled back to its state in the last good checkpoint, in memory and
// in the new file, and the previous generation is kept next to the file.
// A damaged checkpoint falls back to that previous generation on start.
func TestCheckpointRollsBackNonFiniteExpert(t *testing.T) {
	e := newEnv(t)
	path := filepath.Join(t.TempDir(), "experts.safetensors")
	cfg := Config{Transport: e.srv, Experts: []string{"ffn.0", "ffn.1"}, Hidden: 8, LR: 0.01, Seed: 3, CheckpointPath: path}
	s, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	train := func(uid string) {
		t.Helper()
		if _, err := e.call(ctx, moe.BackwardProtocol, uid, wire.Named{Name: "x", Tensor: randTensor(1, 4, 8)}, wire.Named{Name: "dy", Tensor: randTensor(2, 4, 8)}); err != nil {
			t.Fatal(err)
		}
	}
	train("ffn.0")
	if err := s.Save(path); err != nil {
		t.Fatal(err)
	}
	good := s.ExpertWeights("ffn.0")
	train("ffn.0")
	train("ffn.1")
	trained1 := s.ExpertWeights("ffn.1")
	ex := s.experts["ffn.0"]
	ex.mu.Lock()
	ex.module.Params()[0].Value.Data[0] = float32(math.NaN())
	ex.mu.Unlock()
	if err := s.Save(path); err != nil {
		t.Fatal(err)
	}
	if !weightsEqual(good, s.ExpertWeights("ffn.0")) {
		t.Fatal("the poisoned expert was not restored to its last checkpointed weights")
	}
	if st := s.Stats().Experts[0]; st.Rollbacks != 1 {
		t.Fatalf("rollbacks %d, want 1", st.Rollbacks)
	}
	f, err := checkpoint.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	if !tensorsFinite(f.Tensors) || f.Meta["ffn.0/step"] != "1" || f.Meta["ffn.1/step"] != "1" {
		t.Fatalf("checkpoint after the rollback: finite %v, steps %s and %s", tensorsFinite(f.Tensors), f.Meta["ffn.0/step"], f.Meta["ffn.1/step"])
	}
	if _, err := os.Stat(path + PrevSuffix); err != nil {
		t.Fatalf("previous generation not kept: %v", err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	// Damage the latest generation: the server starts from the previous
	// one (written by the Save above, before Close saved again).
	if err := os.WriteFile(path, []byte("garbage"), 0o644); err != nil {
		t.Fatal(err)
	}
	s2, err := New(cfg)
	if err != nil {
		t.Fatalf("start with a damaged checkpoint and a good previous one: %v", err)
	}
	defer s2.Close()
	if !weightsEqual(good, s2.ExpertWeights("ffn.0")) || !weightsEqual(trained1, s2.ExpertWeights("ffn.1")) {
		t.Fatal("the previous generation was not loaded")
	}
}

// An honest trainer's gradients stay far below DefaultClipNorm: a small
// regression trained through backward calls (mean-squared error, the
// gradient a trainer sends) takes exactly the same steps with the default
// clip as without clipping, and none of them is clipped.
func TestDefaultClipLeavesHonestTrainingAlone(t *testing.T) {
	run := func(clip float64) (map[string]*tensor.Tensor, ExpertStats, float64, float64) {
		e := newEnv(t)
		s, err := New(Config{Transport: e.srv, Experts: []string{"ffn.0"}, Hidden: 16, LR: 3e-3, Seed: 7, ClipNorm: clip})
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		rng := rand.New(rand.NewPCG(5, 5))
		target := randTensor(9, 16, 16) // y* = tanh(x·A)
		var loss, first float64
		for step := range 60 {
			x := tensor.New(32, 16)
			tensor.FillNormal(x.Data, rng, 0, 1)
			out, err := e.call(ctx, moe.ForwardProtocol, "ffn.0", wire.Named{Name: "x", Tensor: x})
			if err != nil {
				t.Fatal(err)
			}
			y := wire.Get(out, "y")
			dy := tensor.New(32, 16)
			loss = 0
			for i := range 32 {
				for j := range 16 {
					var want float64
					for k := range 16 {
						want += float64(x.Data[i*16+k]) * float64(target.Data[k*16+j]) / 4
					}
					d := float64(y.Data[i*16+j]) - math.Tanh(want)
					loss += d * d / (32 * 16)
					dy.Data[i*16+j] = float32(2 * d / (32 * 16))
				}
			}
			if _, err := e.call(ctx, moe.BackwardProtocol, "ffn.0", wire.Named{Name: "x", Tensor: x}, wire.Named{Name: "dy", Tensor: dy}); err != nil {
				t.Fatal(err)
			}
			if step == 0 {
				first = loss
			}
		}
		return s.ExpertWeights("ffn.0"), s.Stats().Experts[0], first, loss
	}
	wDef, stDef, first, lossDef := run(0)
	wOff, _, _, lossOff := run(-1)
	if !(lossDef < first/2) {
		t.Fatalf("honest training did not converge: loss %g after 60 steps, %g at the start", lossDef, first)
	}
	if stDef.ClippedSteps != 0 || stDef.Updates != 60 {
		t.Fatalf("default clip: %d of %d steps clipped", stDef.ClippedSteps, stDef.Updates)
	}
	if !weightsEqual(wDef, wOff) || lossDef != lossOff {
		t.Fatalf("default clip changed honest training: loss %g vs %g unclipped", lossDef, lossOff)
	}
	_, stTight, _, _ := run(1e-4)
	if stTight.ClippedSteps == 0 {
		t.Fatal("a tiny clip norm clipped nothing: the counter or the clip does not work")
	}
}

// Lazy experts are checked against the same spec before they exist.
func TestRefusedRequestDoesNotMaterialize(t *testing.T) {
	e := newEnv(t)
	s, err := New(Config{Transport: e.srv, Experts: []string{"ffn.0"}, Hidden: 8, Lazy: true})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err = e.call(ctx, moe.ForwardProtocol, "ffn.0", wire.Named{Name: "x", Tensor: filled(float32(math.Inf(-1)), 2, 8)})
	expectRemote(t, "Inf forward", err, "finite")
	if s.ExpertWeights("ffn.0") != nil {
		t.Fatal("a refused request created the expert")
	}
}

// A checkpoint that holds non-finite weights (written by an older server,
// or edited) does not bring them back: the expert is loaded from the
// previous generation if that one is good, else it starts afresh.
func TestLoadSkipsNonFiniteExpert(t *testing.T) {
	e := newEnv(t)
	path := filepath.Join(t.TempDir(), "experts.safetensors")
	cfg := Config{Transport: e.srv, Experts: []string{"ffn.0", "ffn.1"}, Hidden: 8, Seed: 3, CheckpointPath: path}
	s, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	fresh := s.ExpertWeights("ffn.1")
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	// Poison both experts in the latest file; ffn.0 also in the previous
	// generation, so it can only start afresh; ffn.1 has a good previous
	// state, marked by a changed weight.
	f, err := checkpoint.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	f.Tensors["ffn.1/ffn.fc1.weight"].Data[0] = 0.5
	f.Tensors["ffn.0/ffn.fc1.weight"].Data[0] = float32(math.NaN())
	if err := checkpoint.Save(path+PrevSuffix, f.Tensors, f.Meta); err != nil {
		t.Fatal(err)
	}
	good1 := f.Tensors["ffn.1/ffn.fc1.weight"].Clone()
	f.Tensors["ffn.1/opt/ffn.fc1.weight.v"].Data[0] = float32(math.Inf(1))
	if err := checkpoint.Save(path, f.Tensors, f.Meta); err != nil {
		t.Fatal(err)
	}
	cfg.CheckpointPath = "" // load by hand below, so Close does not save
	s2, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer s2.Close()
	if err := s2.load(path); err != nil {
		t.Fatal(err)
	}
	if w := s2.ExpertWeights("ffn.0"); !tensorsFinite(w) {
		t.Fatal("ffn.0 loaded with NaN weights")
	}
	if d := maxDiff(s2.ExpertWeights("ffn.1")["ffn.fc1.weight"].Data, good1.Data); d != 0 {
		t.Fatalf("ffn.1 not loaded from the previous generation (differs by %g)", d)
	}
	if weightsEqual(fresh, s2.ExpertWeights("ffn.1")) {
		t.Fatal("ffn.1 started afresh although the previous generation was good")
	}
}
