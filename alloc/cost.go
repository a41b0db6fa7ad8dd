package alloc

import (
	"errors"
	"fmt"
	"math"
)

// Objective is what a plan is scored by.
type Objective int

const (
	// ObjIteration is the predicted iteration time of the model's schedule:
	// sequential when Model.MicroBatches ≤ 1, GPipe-pipelined otherwise.
	// It includes stage-to-stage transfers.
	ObjIteration Objective = iota
	// ObjBottleneck is the paper's objective: the largest per-device
	// compute time (fwd+bwd FLOPs / speed), network ignored.
	ObjBottleneck
)

// String names the objective.
func (o Objective) String() string {
	switch o {
	case ObjIteration:
		return "iteration"
	case ObjBottleneck:
		return "bottleneck"
	}
	return fmt.Sprintf("Objective(%d)", int(o))
}

// ParseObjective parses "iteration" or "bottleneck".
func ParseObjective(s string) (Objective, error) {
	switch s {
	case "", "iteration":
		return ObjIteration, nil
	case "bottleneck":
		return ObjBottleneck, nil
	}
	return 0, fmt.Errorf("alloc: unknown objective %q (want iteration or bottleneck)", s)
}

// StageReport is the predicted cost of one stage.
type StageReport struct {
	Stage
	// DeviceName is the name of the stage's device.
	DeviceName string
	// Compute is the stage's forward+backward time for the whole batch.
	Compute float64
	// Comm is the time to send the stage's output activation to the next
	// stage and to receive the gradient back, for the whole batch:
	// 2·(latency + OutputBytes/bandwidth). Zero for the last stage.
	Comm float64
	// MemBytes is the memory the stage needs; MemCap the device's memory.
	MemBytes, MemCap int64
}

// Report is the predicted cost of a plan under the cost model.
type Report struct {
	Stages []StageReport
	// MicroBatches used for Pipelined (≥ 1).
	MicroBatches int
	// Sequential is the paper's schedule: one batch goes forward stage by
	// stage and back: Σ Compute + Σ Comm.
	Sequential float64
	// Pipelined is the GPipe estimate with M micro-batches (see Evaluate).
	// It equals Sequential when M = 1.
	Pipelined float64
	// Iteration is the time of the model's schedule (Pipelined, which is
	// Sequential when the model has at most one micro-batch).
	Iteration float64
	// Bottleneck is the paper's objective: max over stages of Compute.
	Bottleneck float64
	// OverMemBytes is the total memory by which stages exceed their
	// devices (0 for a feasible plan).
	OverMemBytes int64
}

// Value returns the report's value for an objective.
func (r *Report) Value(o Objective) float64 {
	if o == ObjBottleneck {
		return r.Bottleneck
	}
	return r.Iteration
}

// Feasible reports whether every stage fits its device's memory.
func (r *Report) Feasible() bool { return r.OverMemBytes == 0 }

// Evaluate predicts the cost of plan p for model m on cluster c.
//
// With M micro-batches, stage k's per-micro-batch compute is
// c_k = (Fwd_k+Bwd_k)/(M·speed_k), the link after stage k has latency λ_k
// and per-micro-batch occupancy s_k = OutputBytes/(M·bandwidth) in each
// direction (links are full duplex: activations go forward while gradients
// come back). The GPipe estimate is
//
//	T = Σ_k c_k + Σ_k 2·(λ_k + s_k) + (M−1)·max(max_k c_k, max_k s_k)
//
// i.e. the time for one micro-batch to go through the pipeline and back,
// plus M−1 further micro-batches each limited by the slowest stage or
// link. With M = 1 this is the sequential time Σ compute + Σ transfers.
func Evaluate(c *Cluster, m *Model, p Plan) (*Report, error) {
	if err := (Problem{Cluster: c, Model: m}).validate(); err != nil {
		return nil, err
	}
	if err := p.Validate(len(c.Devices), len(m.Layers)); err != nil {
		return nil, err
	}
	M := m.Micro()
	r := &Report{MicroBatches: M}
	var sumC, sumL, maxC, maxS float64
	for k, s := range p.Stages {
		d := c.Devices[s.Device]
		var flops float64
		var mem int64
		for _, l := range m.Layers[s.First:s.Last] {
			flops += l.FwdFLOPs + l.BwdFLOPs
			mem += l.MemBytes()
		}
		sr := StageReport{Stage: s, DeviceName: d.Name, Compute: flops / d.Speed, MemBytes: mem, MemCap: d.MemBytes}
		if k+1 < len(p.Stages) {
			link := c.Link(s.Device, p.Stages[k+1].Device)
			out := float64(m.Layers[s.Last-1].OutputBytes)
			sr.Comm = 2 * link.Transfer(out)
			perMicro := 0.0
			if link.Bandwidth > 0 {
				perMicro = out / float64(M) / link.Bandwidth
			}
			sumL += 2 * (link.Latency + perMicro)
			maxS = math.Max(maxS, perMicro)
		}
		if mem > d.MemBytes {
			r.OverMemBytes += mem - d.MemBytes
		}
		r.Sequential += sr.Compute + sr.Comm
		r.Bottleneck = math.Max(r.Bottleneck, sr.Compute)
		cm := sr.Compute / float64(M)
		sumC += cm
		maxC = math.Max(maxC, cm)
		r.Stages = append(r.Stages, sr)
	}
	r.Pipelined = sumC + sumL + float64(M-1)*math.Max(maxC, maxS)
	r.Iteration = r.Pipelined
	return r, nil
}

// ErrInfeasible is wrapped by every error saying a model cannot fit.
var ErrInfeasible = errors.New("alloc: infeasible")

// MemoryError says the cluster lacks memory for the model.
type MemoryError struct {
	// Need is the memory the model needs; Have the cluster's total.
	Need, Have int64
	// Missing is how much memory is lacking, at least: the totals' gap, or
	// what the largest layer lacks on the largest device.
	Missing int64
	// Detail explains the failure.
	Detail string
}

// Error says how much memory is missing.
func (e *MemoryError) Error() string {
	return fmt.Sprintf("alloc: infeasible: %s (model needs %s, cluster has %s): need %s more",
		e.Detail, GiB(e.Need), GiB(e.Have), GiB(e.Missing))
}

// Unwrap makes errors.Is(err, ErrInfeasible) true.
func (e *MemoryError) Unwrap() error { return ErrInfeasible }

// GiB formats a byte count as GiB with one decimal.
func GiB(b int64) string { return fmt.Sprintf("%.1f GiB", float64(b)/(1<<30)) }

// compileFitting compiles p for a heuristic strategy, refusing models that
// cannot fit for a simple reason (checkMemory).
func compileFitting(p Problem) (*inst, error) {
	in, err := compile(p)
	if err != nil {
		return nil, err
	}
	if err := checkMemory(p.Cluster, p.Model); err != nil {
		return nil, err
	}
	return in, nil
}

// checkMemory returns a *MemoryError when the model cannot fit for a
// simple reason: total memory, or a layer larger than every device.
func checkMemory(c *Cluster, m *Model) error {
	var need, have, maxCap, maxLayer int64
	for _, l := range m.Layers {
		need += l.MemBytes()
		maxLayer = max(maxLayer, l.MemBytes())
	}
	for _, d := range c.Devices {
		have += d.MemBytes
		maxCap = max(maxCap, d.MemBytes)
	}
	if need > have {
		return &MemoryError{Need: need, Have: have, Missing: need - have, Detail: "total memory too small"}
	}
	if maxLayer > maxCap {
		return &MemoryError{Need: need, Have: have, Missing: maxLayer - maxCap,
			Detail: fmt.Sprintf("largest layer needs %s but the largest device has %s", GiB(maxLayer), GiB(maxCap))}
	}
	return nil
}

// inst is a problem compiled for the solvers: prefix sums and region
// indices.
type inst struct {
	c     *Cluster
	m     *Model
	n, L  int
	M     int
	work  []float64 // prefix sums of fwd+bwd FLOPs, len L+1
	mem   []int64   // prefix sums of layer memory, len L+1
	out   []float64 // OutputBytes of layer i
	speed []float64
	cap   []int64
	reg   []int    // region index per device
	links [][]Link // region × region
}

func compile(p Problem) (*inst, error) {
	if err := p.validate(); err != nil {
		return nil, err
	}
	c, m := p.Cluster, p.Model
	in := &inst{c: c, m: m, n: len(c.Devices), L: len(m.Layers), M: m.Micro()}
	in.work = make([]float64, in.L+1)
	in.mem = make([]int64, in.L+1)
	in.out = make([]float64, in.L)
	for i, l := range m.Layers {
		in.work[i+1] = in.work[i] + l.FwdFLOPs + l.BwdFLOPs
		in.mem[i+1] = in.mem[i] + l.MemBytes()
		in.out[i] = float64(l.OutputBytes)
	}
	regions := c.Regions()
	idx := map[string]int{}
	for i, r := range regions {
		idx[r] = i
	}
	for _, d := range c.Devices {
		in.speed = append(in.speed, d.Speed)
		in.cap = append(in.cap, d.MemBytes)
		in.reg = append(in.reg, idx[d.Region])
	}
	in.links = make([][]Link, len(regions))
	for a := range regions {
		in.links[a] = make([]Link, len(regions))
		for b := range regions {
			in.links[a][b] = c.RegionLink(regions[a], regions[b])
		}
	}
	return in, nil
}

// stageTime is the whole-batch compute time of layers [p,q) on device d.
func (in *inst) stageTime(d, p, q int) float64 { return (in.work[q] - in.work[p]) / in.speed[d] }

// fits reports whether layers [p,q) fit device d's memory.
func (in *inst) fits(d, p, q int) bool { return in.mem[q]-in.mem[p] <= in.cap[d] }

// reach returns the largest q ≥ p such that layers [p,q) fit device d and
// take at most t seconds on it.
func (in *inst) reach(d, p int, t float64) int {
	// Binary search over q in [p, L]; both constraints are monotone in q.
	lo, hi := p, in.L
	limW := in.work[p] + t*in.speed[d]*(1+1e-12)
	limM := in.mem[p] + in.cap[d]
	for lo < hi {
		mid := (lo + hi + 1) / 2
		if in.work[mid] <= limW && in.mem[mid] <= limM {
			lo = mid
		} else {
			hi = mid - 1
		}
	}
	return lo
}
