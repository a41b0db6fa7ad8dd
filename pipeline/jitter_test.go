package pipeline

import "testing"

// uniformPipeline is a cost model and S stages of one layer each whose
// ops take f forward and b backward per micro-batch of 4, with factors;
// M micro-batches.
func uniformPipeline(factors []float64, M int, f, b float64) (*costModel, []simStage, []int) {
	S := len(factors)
	cm := &costModel{
		fwd: map[int][]float64{4: make([]float64, S)}, bwd: map[int][]float64{4: make([]float64, S)},
		params: make([]int64, S), outFloats: make([]int64, S), profBatch: 4, modelFLOPs: 1, refTotal: 1,
	}
	stages := make([]simStage, S)
	for k := range stages {
		cm.fwd[4][k], cm.bwd[4][k], cm.outFloats[k] = f, b, 8
		stages[k] = simStage{first: k, last: k + 1, factor: factors[k]}
	}
	sizes := make([]int, M)
	for i := range sizes {
		sizes[i] = 4
	}
	return cm, stages, sizes
}

// TestJitterSlowsBalancedPipelines checks the jittered prediction: it is
// the expected replay without jitter, repeatable (seeded), slower than the
// expected replay with it, and slower by more for a balanced pipeline than
// for one whose bottleneck stage leaves the others slack; the compute
// times stay the expected ones.
func TestJitterSlowsBalancedPipelines(t *testing.T) {
	const M, f, b = 8, 0.010, 0.020
	balanced, bst, sizes := uniformPipeline([]float64{1, 1, 1, 1}, M, f, b)
	skewed, sst, _ := uniformPipeline([]float64{1, 0.25, 0.25, 0.25}, M, f, b)
	for _, cm := range []*costModel{balanced, skewed} {
		st := bst
		if cm == skewed {
			st = sst
		}
		exp := cm.simulate(st, OneFOneB, sizes)
		cm.jitter = 0.3
		p1, p2 := cm.simulate(st, OneFOneB, sizes), cm.simulate(st, OneFOneB, sizes)
		if p1.Iteration != p2.Iteration {
			t.Fatalf("jittered predictions differ between calls: %v, %v", p1.Iteration, p2.Iteration)
		}
		if !(p1.Iteration > exp.Iteration) {
			t.Errorf("jitter 0.3: %.4f s, not above the expected replay's %.4f s", p1.Iteration, exp.Iteration)
		}
		if p1.Compute != exp.Compute {
			t.Errorf("jittered compute %v, want the expected %v", p1.Compute, exp.Compute)
		}
	}
	rel := func(cm *costModel, st []simStage) float64 {
		cm.jitter = 0
		e := cm.simulate(st, OneFOneB, sizes).Iteration
		cm.jitter = 0.3
		return cm.simulate(st, OneFOneB, sizes).Iteration / e
	}
	if rb, rs := rel(balanced, bst), rel(skewed, sst); !(rb > rs) {
		t.Errorf("jitter slows the balanced pipeline ×%.3f, the skewed one ×%.3f: want the balanced one slowed more", rb, rs)
	}
}
