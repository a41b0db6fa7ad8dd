package optimizer

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/skyhive/skyhive/averaging"
	"github.com/skyhive/skyhive/nn"
	"github.com/skyhive/skyhive/optim"
)

// TestStreamingDiLoCoSchedule: fragment p of F takes its outer steps after
// the inner steps t with t mod H = p·H/F, numbered from 1.
func TestStreamingDiLoCoSchedule(t *testing.T) {
	s, err := newStream(Config{Algo: DiLoCo, InnerSteps: 6, Fragments: 3}, 10)
	if err != nil {
		t.Fatal(err)
	}
	if want := []int{0, 3, 6, 10}; !slices.Equal(s.bounds, want) {
		t.Errorf("bounds %v, want %v", s.bounds, want)
	}
	var got []string
	for step := 1; step <= 12; step++ {
		ps, ks := s.due(step)
		for i, p := range ps {
			got = append(got, fmt.Sprintf("%d:f%d#%d", step, p, ks[i]))
		}
	}
	want := []string{"2:f1#1", "4:f2#1", "6:f0#1", "8:f1#2", "10:f2#2", "12:f0#2"}
	if !slices.Equal(got, want) {
		t.Errorf("schedule %v, want %v", got, want)
	}
	if s, err := newStream(Config{Algo: DiLoCo, InnerSteps: 6, Fragments: 1}, 10); s != nil || err != nil {
		t.Errorf("one fragment without overlap: %v, %v; want DiLoCo's whole-model steps", s, err)
	}
}

// TestStreamingDiLoCoMatchesReference: 3 peers with fragments, with and
// without overlap, against a one-process reference of the replicas that
// writes the schedule and the outer step from their formulas. With one
// fragment and no overlap this is the plain DiLoCo reference.
func TestStreamingDiLoCoMatchesReference(t *testing.T) {
	for _, c := range []struct{ h, frags, overlap, steps int }{
		{4, 2, 0, 13},
		{4, 2, 1, 13},
		{6, 3, 2, 17},
		{3, 1, 1, 10},
	} {
		t.Run(fmt.Sprintf("H%d_F%d_O%d", c.h, c.frags, c.overlap), func(t *testing.T) {
			testStreamingMatchesReference(t, c.h, c.frags, c.overlap, c.steps)
		})
	}
}

func testStreamingMatchesReference(t *testing.T, h, frags, overlap, steps int) {
	const peers, per = 3, 8
	const eta, mu = 0.7, 0.9
	task := newBlobTask(t, peers, per, steps)
	sgd := optim.SGDConfig{LR: 0.05, Momentum: 0.9}

	reps, repOpts, anchor := task.replicas(sgd)
	n := len(anchor)
	v := make([]float32, n)
	theta := make([][]float32, peers)
	for p := range theta {
		theta[p] = make([]float32, n)
	}
	type flight struct {
		lo, hi, due int
		snaps       [][]float32
		mean        []float32
	}
	var flights []flight
	apply := func(step int) {
		for len(flights) > 0 && flights[0].due <= step {
			f := flights[0]
			flights = flights[1:]
			for j := f.lo; j < f.hi; j++ {
				g := f.mean[j-f.lo]
				v[j] = mu*v[j] + g
				anchor[j] -= eta * (g + mu*v[j])
			}
			for p := range peers {
				for j := f.lo; j < f.hi; j++ {
					theta[p][j] += anchor[j] - f.snaps[p][j-f.lo]
				}
			}
		}
	}
	for step := 1; step <= steps; step++ {
		for p := range peers {
			repOpts[p].ZeroGrad()
			task.grad(reps[p], task.batch(step-1, p))
			repOpts[p].Step()
			nn.FlatValues(reps[p].Params(), theta[p])
		}
		apply(step)
		for q := range frags {
			if step%h != q*h/frags {
				continue
			}
			lo, hi := q*n/frags, (q+1)*n/frags
			f := flight{lo: lo, hi: hi, due: step + overlap, mean: make([]float32, hi-lo)}
			for p := range peers {
				f.snaps = append(f.snaps, slices.Clone(theta[p][lo:hi]))
				for j := lo; j < hi; j++ {
					f.mean[j-lo] += (anchor[j] - theta[p][j]) / peers
				}
			}
			flights = append(flights, f)
		}
		apply(step)
		for p := range peers {
			nn.SetFlatValues(reps[p].Params(), theta[p])
		}
	}

	models := make([]*nn.Sequential, peers)
	opts := swarm(t, peers, averaging.Config{Timeout: 10 * time.Second, ChunkElems: 100}, func(p int) (optim.Optimizer, Config) {
		models[p] = task.build()
		return optim.NewSGD(models[p].Params(), sgd), Config{Algo: DiLoCo, InnerSteps: h, Fragments: frags, OverlapSteps: overlap}
	})
	got := train(t, opts, steps, func(p, s int) { task.grad(models[p], task.batch(s, p)) })
	syncs := 0
	for step := 1; step+overlap <= steps; step++ {
		for q := range frags {
			if step%h == q*h/frags {
				syncs++
			}
		}
	}
	for p, o := range opts {
		if d := maxDiff(got[p], theta[p]); d > 1e-5 {
			t.Errorf("peer %d's model differs from the reference by %v", p, d)
		}
		o.mu.Lock()
		da, dv := maxDiff(outerOf(o).anchor, anchor), maxDiff(outerOf(o).mom, v)
		o.mu.Unlock()
		if da > 1e-5 || dv > 1e-5 {
			t.Errorf("peer %d: outer model and momentum differ from the reference by %v and %v", p, da, dv)
		}
		if st := o.Stats(); st.OuterSteps != syncs || st.GlobalSyncs != syncs || st.Steps != steps || st.Round != steps/h || st.Failures != 0 {
			t.Errorf("peer %d: want %d outer steps, round %d: %+v", p, syncs, steps/h, st)
		}
	}
}
