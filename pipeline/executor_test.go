package pipeline

import (
	"context"
	"crypto/rand"
	"math"
	mrand "math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/crypto"
	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/skyhive/skyhive/models"
	"github.com/skyhive/skyhive/nn"
	"github.com/skyhive/skyhive/swarm"
	"github.com/skyhive/skyhive/tensor"
)

// chanSender is an actSender that delivers each tensor straight into the
// neighbour's inbox through a channel, with no network.
type chanSender struct {
	ch   chan senderItem
	done chan error
}

func newChanSender(to *inbox, iter int, backward bool, m int) *chanSender {
	s := &chanSender{ch: make(chan senderItem, m), done: make(chan error, 1)}
	go func() {
		var err error
		for it := range s.ch {
			if err == nil {
				err = to.put(actKey{iter: iter, micro: it.micro, backward: backward}, it.t)
			}
		}
		s.done <- err
	}()
	return s
}

func (s *chanSender) send(micro int, t *tensor.Tensor) { s.ch <- senderItem{micro, t} }

func (s *chanSender) finish() (time.Duration, error) {
	close(s.ch)
	return 0, <-s.done
}

// TestExecutorOverChannels runs one iteration of two stages whose tensors
// travel through channels, under each schedule, and compares the loss and
// every parameter's gradient with a single-process pass over the same
// micro-batches.
func TestExecutorOverChannels(t *testing.T) {
	const model, seed, n, split = "deep-mlp:48x4", 5, 12, 4
	ref, err := models.Build(model, seed)
	if err != nil {
		t.Fatal(err)
	}
	params := ref.Params()
	optCfg := OptimConfig{LR: 1e-2}
	ostate := optCfg.NewOptimizer(params).State()
	snap := Snapshot{Params: nn.ExportParams(params), Optim: ostate.Tensors, Step: ostate.Step}
	var ids [2]peer.ID
	for k := range ids {
		priv, _, err := crypto.GenerateEd25519Key(rand.Reader)
		if err != nil {
			t.Fatal(err)
		}
		if ids[k], err = peer.IDFromPrivateKey(priv); err != nil {
			t.Fatal(err)
		}
	}
	rng := mrand.New(mrand.NewPCG(seed, 1))
	x := tensor.New(n, InputFeatures)
	tensor.FillNormal(x.Data, rng, 0, 1)
	y := make([]int, n)
	for i := range y {
		y[i] = rng.IntN(10)
	}

	for _, tc := range []struct {
		sched Schedule
		sizes []int
	}{{Sequential, []int{n}}, {GPipe, []int{4, 4, 4}}, {OneFOneB, []int{5, 4, 3}}} {
		t.Run(tc.sched.String(), func(t *testing.T) {
			workers := make([]*Worker, 2)
			stages := make([]*stage, 2)
			boxes := make([]*inbox, 2)
			for k := range 2 {
				req := setupReq{Gen: 1, Stage: k, Stages: 2, Model: model, Seed: seed, Batch: n, Optim: optCfg}
				if k == 0 {
					req.First, req.Last, req.Next = 0, split, refOf(peer.AddrInfo{ID: ids[1]})
				} else {
					req.First, req.Last, req.Prev = split, ref.Len(), refOf(peer.AddrInfo{ID: ids[0]})
				}
				part, err := snap.forParams(ref.Slice(req.First, req.Last).Params())
				if err != nil {
					t.Fatal(err)
				}
				dev, err := swarm.NewDevice("test", 1, 0)
				if err != nil {
					t.Fatal(err)
				}
				workers[k] = &Worker{dev: dev}
				if stages[k], err = workers[k].buildStage(context.Background(), req, mapNamed(part.tensors())); err != nil {
					t.Fatal(err)
				}
				boxes[k] = newInbox(0, stages[k].in, stages[k].out)
			}
			for k, w := range workers {
				w.dial = func(_ context.Context, _ peer.AddrInfo, req iterReq, backward bool, m int, _ context.CancelCauseFunc) actSender {
					return newChanSender(boxes[1-k], req.Iter, backward, m)
				}
			}
			req := iterReq{Gen: 1, Schedule: tc.sched, Sizes: tc.sizes}
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			resps := make([]iterResp, 2)
			errs := make([]error, 2)
			var wg sync.WaitGroup
			for k, w := range workers {
				wg.Go(func() {
					var in *tensor.Tensor
					var labels []int
					if k == 0 {
						in = x
					} else {
						labels = y
					}
					resps[k], errs[k] = w.runIter(ctx, stages[k], boxes[k], req, in, labels)
				})
			}
			wg.Wait()
			for k, err := range errs {
				if err != nil {
					t.Fatalf("stage %d: %v", k, err)
				}
			}

			// The same micro-batches in one process.
			nn.ZeroGrad(params)
			wantLoss, lo := 0.0, 0
			for _, m := range tc.sizes {
				logits, st := ref.Forward(nn.Ctx{Train: true}, rows(x, lo, lo+m))
				loss, dl := nn.SoftmaxCrossEntropy(logits, y[lo:lo+m])
				tensor.Scale(float32(m)/float32(n), dl.Data)
				ref.Backward(st, dl)
				wantLoss += float64(loss) * float64(m) / float64(n)
				lo += m
			}
			if math.Abs(resps[1].Loss-wantLoss) > 1e-5 {
				t.Errorf("loss %v, single process %v", resps[1].Loss, wantLoss)
			}
			want := map[string]*tensor.Tensor{}
			for _, p := range params {
				want[p.Name] = p.Grad
			}
			checked := 0
			for _, st := range stages {
				for _, p := range st.params {
					w := want[p.Name]
					if w == nil {
						t.Fatalf("stage parameter %s not in the model", p.Name)
					}
					for i, g := range p.Grad.Data {
						if d := math.Abs(float64(g - w.Data[i])); d > 1e-6+1e-4*math.Abs(float64(w.Data[i])) {
							t.Fatalf("grad %s[%d] = %v, single process %v", p.Name, i, g, w.Data[i])
						}
					}
					checked++
				}
			}
			if checked != len(params) {
				t.Fatalf("stages hold %d parameters, model %d", checked, len(params))
			}
		})
	}
}
