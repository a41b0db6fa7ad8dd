package optimizer

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/skyhive/skyhive/averaging"
	"github.com/skyhive/skyhive/nn"
	"github.com/skyhive/skyhive/optim"
)

// TestWAGMAGlobalAverageSupersedesGroups: a group average taken from the
// models before a synchronous global average, and finished after it, is
// dropped; applied, its correction (the group's mean of the old models
// less this peer's old model) would pull each replica away from the
// global mean again.
func TestWAGMAGlobalAverageSupersedesGroups(t *testing.T) {
	const peers, n, tau = 2, 200, 8
	opts := swarm(t, peers, averaging.Config{Timeout: 5 * time.Second}, func(p int) (optim.Optimizer, Config) {
		w := vecParam(n, float32(p), uint64(80+p)) // zero gradients: inner steps change nothing
		return optim.NewSGD([]*nn.Param{w}, optim.SGDConfig{LR: 0.01}), Config{Algo: WAGMA, Tau: tau, GroupSize: 2}
	})
	mean := make([]float32, n)
	snaps, syncs := make([][]float32, peers), make([]int, peers)
	for p, o := range opts {
		o.mu.Lock()
		o.round = tau - 1 // the next Step is a global round
		snaps[p], syncs[p] = o.snapshotLocked(), o.syncs
		o.mu.Unlock()
		for j, v := range snaps[p] {
			mean[j] += v / peers
		}
	}
	var wg sync.WaitGroup
	for _, o := range opts {
		wg.Go(func() {
			if err := o.Step(context.Background(), 1); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	for p, o := range opts {
		if d := maxDiff(o.Snapshot(), mean); d > 1e-5 {
			t.Fatalf("peer %d: %v off the mean after the global average", p, d)
		}
	}
	// The group average of the old models finishes now.
	ms := allMembers(opts)
	for p, o := range opts {
		wg.Go(func() {
			if _, err := o.averageInto(context.Background(), averaging.Session{ID: "test/w/7/0", Members: ms}, snaps[p], tau-1, syncs[p]); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	for p, o := range opts {
		if d := maxDiff(o.Snapshot(), mean); d > 1e-5 {
			t.Errorf("peer %d: a superseded group average moved the model %v off the global mean", p, d)
		}
		if st := o.Stats(); st.GroupDropped != 1 {
			t.Errorf("peer %d: %d group averages dropped, want 1", p, st.GroupDropped)
		}
	}
}

// allMembers is every peer of the swarm as a session's members.
func allMembers(opts []*Optimizer) []averaging.Member {
	return opts[0].ranks.alive(opts[0].ranks.allRanks())
}
