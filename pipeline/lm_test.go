package pipeline

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/skyhive/skyhive/alloc"
	"github.com/skyhive/skyhive/nn"
	"github.com/skyhive/skyhive/optim"
	"github.com/skyhive/skyhive/p2p"
	"github.com/skyhive/skyhive/tensor"
	"github.com/skyhive/skyhive/text"
	"github.com/skyhive/skyhive/wire"
)

// dictionaryText is a few dictionary-style English definitions, written
// for these tests in the manner of GCIDE's entries.
const dictionaryText = `Anchor, n. A heavy iron instrument, lowered from a ship by a cable or
chain, which holds the vessel in place by grappling the bottom of the sea.
Beacon, n. A signal fire kept burning on a height, to give warning of the
approach of an enemy, or to guide ships at night; hence, anything that
gives notice of danger or shows the way. Cable, n. A large, strong rope
or chain, such as is used to hold a vessel at anchor. Harbor, n. A place
of security and comfort; a refuge; especially, a part of the sea so
sheltered by the land that ships may lie there in safety. Lantern, n. Something
inclosing a light, and protecting it from the wind and rain; a case made
of glass or thin horn, in which a light is carried at night. Tide, n. The
alternate rising and falling of the waters of the ocean and of the bays
and rivers that flow into it, which happens twice in each day. Voyage, n.
A passing by sea or water from one place, port, or country to another;
especially, a going to a distant place by sea, and the return.`

// lmSpec, lmTokens: a GPT small enough for the tests and the dictionary
// text in the tokens of a byte-level BPE trained on it.
func lmData(t *testing.T) (spec string, tokens []int32) {
	t.Helper()
	tok, err := text.TrainBPE([]byte(dictionaryText), 320)
	if err != nil {
		t.Fatal(err)
	}
	return "gpt-mini:320x16", tok.Encode([]byte(dictionaryText))
}

// lmBatches draws count batches of size windows of 16 tokens.
func lmBatches(t *testing.T, tokens []int32, size, count int) []text.Batch {
	t.Helper()
	smp, err := text.NewSampler(tokens, size, 16, 5)
	if err != nil {
		t.Fatal(err)
	}
	out := make([]text.Batch, count)
	for i := range out {
		out[i] = smp.Next()
	}
	return out
}

// lmReference trains the pipeline's model (BuildModel: untied head) in one
// process, one whole batch at a time, and returns every step's loss.
func lmReference(t *testing.T, cfg SessionConfig, bs []text.Batch) []float64 {
	t.Helper()
	model, err := BuildModel(cfg.Model, cfg.Seed)
	if err != nil {
		t.Fatal(err)
	}
	params := model.Params()
	opt := cfg.Optim.NewOptimizer(params)
	var losses []float64
	for _, b := range bs {
		opt.ZeroGrad()
		logits, st := model.Forward(nn.Ctx{Train: true}, b.X)
		loss, dl := nn.SequenceCrossEntropy(logits, b.Labels())
		model.Backward(st, dl)
		if cfg.ClipNorm > 0 {
			optim.ClipGradNorm(params, cfg.ClipNorm)
		}
		opt.SetLR(cfg.Optim.LR)
		opt.Step()
		losses = append(losses, float64(loss))
	}
	return losses
}

// TestLMSchedulesMatchSingleProcess trains a GPT on dictionary text
// through the pipeline, over 2 or 3 workers on an in-memory network, with
// each schedule, and checks that every step's loss is the loss of
// single-process training of the same model from the same seed on the
// same batches: the untied head, the token inputs and labels, the
// micro-batch weighting and the clipping across stages change nothing.
func TestLMSchedulesMatchSingleProcess(t *testing.T) {
	spec, tokens := lmData(t)
	// gpt-mini's layers: 0 embed, 1 pos, 2 drop, 3–6 dec, 7 ln, 8 head.
	cases := []struct {
		schedule Schedule
		micro    int
		plan     []alloc.Stage
		optim    OptimConfig
		clip     float64
	}{
		{Sequential, 1, []alloc.Stage{{Device: 0, First: 0, Last: 3}, {Device: 1, First: 3, Last: 6}, {Device: 2, First: 6, Last: 9}}, OptimConfig{LR: 3e-3}, 0},
		{GPipe, 4, []alloc.Stage{{Device: 1, First: 0, Last: 5}, {Device: 0, First: 5, Last: 9}}, OptimConfig{Kind: "sgd", LR: 0.1, Momentum: 0.9}, 0.5},
		// Stage 0 is the embedding alone, which returns no input gradient;
		// the last stage is the final LayerNorm and the head.
		{OneFOneB, 3, []alloc.Stage{{Device: 2, First: 0, Last: 1}, {Device: 0, First: 1, Last: 7}, {Device: 1, First: 7, Last: 9}}, OptimConfig{LR: 3e-3, WeightDecay: 0.01}, 1},
	}
	const steps, batch = 5, 6
	bs := lmBatches(t, tokens, batch, steps)
	for _, tc := range cases {
		t.Run(tc.schedule.String(), func(t *testing.T) {
			cl := newCluster(t, 1, 1, 1)
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			var log strings.Builder
			cfg := SessionConfig{
				Model: spec, Seed: 13, Batch: batch, Micro: tc.micro, Schedule: tc.schedule,
				Optim: tc.optim, ClipNorm: tc.clip, Plan: &alloc.Plan{Stages: tc.plan}, ProfileReps: 1, Log: &log,
			}
			s, err := cl.c.Start(ctx, cfg)
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			if !strings.Contains(log.String(), "untied") {
				t.Errorf("the session log does not say the head is untied:\n%s", log.String())
			}
			var got []float64
			for _, b := range bs {
				st, err := s.StepTokens(ctx, b)
				if err != nil {
					t.Fatal(err)
				}
				if len(st.Stages) != len(tc.plan) || st.Event != "" {
					t.Fatalf("unexpected iteration %+v", st)
				}
				if !(st.Accuracy >= 0 && st.Accuracy <= 1) {
					t.Fatalf("token accuracy %v", st.Accuracy)
				}
				got = append(got, st.Loss)
			}
			want := lmReference(t, s.cfg, bs)
			for i := range want {
				if d := math.Abs(got[i] - want[i]); d > 1e-4*math.Abs(want[i]) {
					t.Fatalf("step %d: pipeline loss %.7f, single process %.7f", i, got[i], want[i])
				}
			}
			if !(want[steps-1] < want[0]) {
				t.Fatalf("training did not lower the loss: %v", want)
			}
			t.Logf("losses %.5f", got)
		})
	}
}

// TestLMBadBatchRefused: a batch with a token id past the vocabulary,
// labels that do not match the inputs, or sequences of another length is
// refused by the coordinator before anything is sent; the same inputs and
// labels sent straight to the workers are refused by them before any
// compute; the session keeps training.
func TestLMBadBatchRefused(t *testing.T) {
	spec, tokens := lmData(t)
	cl := newCluster(t, 1, 1)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	s, err := cl.c.Start(ctx, SessionConfig{
		Model: spec, Seed: 13, Batch: 4, Micro: 2, Schedule: GPipe, Optim: OptimConfig{LR: 1e-3},
		Plan: &alloc.Plan{Stages: []alloc.Stage{{Device: 0, First: 0, Last: 4}, {Device: 1, First: 4, Last: 9}}}, ProfileReps: 1,
	})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	good := lmBatches(t, tokens, 4, 1)[0]
	clone := func(b text.Batch) text.Batch {
		return text.Batch{X: tensor.FromSlice(append([]float32(nil), b.X.Data...), b.X.Shape...), Y: tensor.FromSlice(append([]float32(nil), b.Y.Data...), b.Y.Shape...)}
	}
	badID := clone(good)
	badID.X.Data[5] = 320
	badLabel := clone(good)
	badLabel.Y.Data[7] = 1e6
	fracID := clone(good)
	fracID.X.Data[0] = 2.5
	short := clone(good)
	short.Y = tensor.FromSlice(short.Y.Data[:4*15], 4, 15)
	long := text.Batch{X: tensor.New(4, 17), Y: tensor.New(4, 17)}
	for _, tc := range []struct {
		name string
		b    text.Batch
		want string
	}{
		{"token id past the vocabulary", badID, "token id 320"},
		{"label past the vocabulary", badLabel, "label 1e+06"},
		{"fractional token id", fracID, "token id 2.5"},
		{"labels of another count", short, "labels \"y\" of shape [4 15]"},
		{"sequences longer than the context", long, "of shape [4 17]"},
	} {
		if _, err := s.StepTokens(ctx, tc.b); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: step error %v, want one about %q", tc.name, err, tc.want)
		}
	}
	if s.Iter() != 0 {
		t.Fatalf("refused batches ran %d iterations", s.Iter())
	}

	// Peers are untrusted: the workers check what arrives themselves.
	send := func(stage int, ts []wire.Named) error {
		req := iterReq{Gen: s.gen, Iter: s.iter, Schedule: GPipe, Sizes: []int{2, 2}, TimeoutMS: 10000}
		var resp iterResp
		_, err := s.c.call(ctx, s.stages[stage].worker, ProtoIter, req, ts, &resp, wire.Limits{})
		return err
	}
	for _, tc := range []struct {
		stage int
		ts    []wire.Named
		want  string
	}{
		{0, []wire.Named{{Name: "x", Tensor: badID.X}}, "token id 320"},
		{0, []wire.Named{{Name: "x", Tensor: fracID.X}}, "token id 2.5"},
		{1, []wire.Named{{Name: "y", Tensor: badLabel.Y}}, "label 1e+06"},
		{1, []wire.Named{{Name: "y", Tensor: short.Y}}, "labels \"y\" of shape [4 15]"},
		{1, []wire.Named{{Name: "y", Tensor: tensor.New(4)}}, "labels \"y\" of shape [4]"},
	} {
		err := send(tc.stage, tc.ts)
		var re *p2p.RemoteError
		if !errors.As(err, &re) || !strings.Contains(re.Msg, tc.want) {
			t.Errorf("stage %d given %s: %v, want refused with %q", tc.stage, fmt.Sprint(tc.ts[0].Tensor.Shape), err, tc.want)
		}
	}

	// An image batch is refused for a language model, and the session
	// still trains on good text.
	if _, err := s.Step(ctx, batches(t, blobs(t, 8, 1), 4, 1)[0]); err == nil || !strings.Contains(err.Error(), "StepTokens") {
		t.Errorf("image batch for a language model: %v", err)
	}
	st, err := s.StepTokens(ctx, good)
	if err != nil {
		t.Fatalf("good batch after the refusals: %v", err)
	}
	if !(st.Loss > 0) || s.Iter() != 1 {
		t.Fatalf("good batch: loss %v, iteration %d", st.Loss, s.Iter())
	}
}
