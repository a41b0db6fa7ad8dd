// Package alloc assigns contiguous blocks of a model's layers to the devices
// of a heterogeneous, possibly geo-distributed cluster, and predicts the
// iteration time of such an assignment.
//
// It reproduces the allocation strategies of Sky Computing (Zhu, Li and You,
// arXiv 2202.11836): "even", the paper's two-phase heuristic "sky" and the
// paper's exact problem "optimal" (minimise the most loaded device's
// workload under memory and contiguity constraints). It adds "skyhive", a
// network-aware strategy that chooses the device order, may leave devices
// out and minimises the predicted iteration time of the full cost model.
//
// The package is pure: no I/O beyond parsing, no goroutines, no global
// mutable state. Units are SI throughout: FLOP, FLOP/s, bytes, seconds,
// bytes per second.
package alloc

import (
	"errors"
	"fmt"
)

// StateCopies is how many copies of a layer's parameters a device holds
// while training with Adam: the weights, their gradients and the two moment
// estimates.
const StateCopies = 4

// Device is one worker of the cluster.
type Device struct {
	// Name identifies the device in plans and tables.
	Name string
	// Speed is the effective compute speed in FLOP/s (measured, not peak).
	Speed float64
	// MemBytes is the memory available for the layers it hosts.
	MemBytes int64
	// Region names the network region (site, cloud zone) the device is in.
	Region string
}

// Link describes a network path between two devices. A zero Bandwidth
// means the transfer time is negligible (infinite bandwidth).
type Link struct {
	// Latency is the one-way latency in seconds.
	Latency float64
	// Bandwidth is in bytes per second; 0 means unlimited.
	Bandwidth float64
}

// Transfer returns the time to send n bytes over the link.
func (l Link) Transfer(n float64) float64 {
	if l.Bandwidth <= 0 {
		return l.Latency
	}
	return l.Latency + n/l.Bandwidth
}

// RegionLink overrides the link between two regions (A and B may be equal,
// which overrides the intra-region link of that region).
type RegionLink struct {
	A, B string
	Link Link
}

// Cluster is a set of devices and the network between them.
type Cluster struct {
	// Devices in their given order ("even" and "sky" use this order).
	Devices []Device
	// Intra is the default link between two devices of the same region.
	Intra Link
	// Inter is the default link between two different regions.
	Inter Link
	// RegionLinks override Intra or Inter for given pairs of regions.
	// Links are symmetric.
	RegionLinks []RegionLink
}

// Regions returns the distinct region names in order of first appearance.
func (c *Cluster) Regions() []string {
	var rs []string
	seen := map[string]bool{}
	for _, d := range c.Devices {
		if !seen[d.Region] {
			seen[d.Region] = true
			rs = append(rs, d.Region)
		}
	}
	return rs
}

// RegionLink returns the link between regions a and b.
func (c *Cluster) RegionLink(a, b string) Link {
	for _, rl := range c.RegionLinks {
		if (rl.A == a && rl.B == b) || (rl.A == b && rl.B == a) {
			return rl.Link
		}
	}
	if a == b {
		return c.Intra
	}
	return c.Inter
}

// Link returns the link between devices i and j.
func (c *Cluster) Link(i, j int) Link {
	return c.RegionLink(c.Devices[i].Region, c.Devices[j].Region)
}

// Validate checks that the cluster is usable.
func (c *Cluster) Validate() error {
	if len(c.Devices) == 0 {
		return errors.New("alloc: cluster has no devices")
	}
	names := map[string]bool{}
	for i, d := range c.Devices {
		if d.Speed <= 0 {
			return fmt.Errorf("alloc: device %d (%q): speed must be positive", i, d.Name)
		}
		if d.MemBytes < 0 {
			return fmt.Errorf("alloc: device %d (%q): negative memory", i, d.Name)
		}
		if names[d.Name] {
			return fmt.Errorf("alloc: duplicate device name %q", d.Name)
		}
		names[d.Name] = true
	}
	return nil
}

// Layer is the cost profile of one layer for a whole batch.
type Layer struct {
	// Name is informative only.
	Name string
	// FwdFLOPs and BwdFLOPs are the FLOPs of the forward and backward
	// passes over the whole batch.
	FwdFLOPs, BwdFLOPs float64
	// ParamBytes is the size of the layer's parameters.
	ParamBytes int64
	// ActivationBytes is the memory held between forward and backward
	// for the whole batch.
	ActivationBytes int64
	// OutputBytes is the size of the activation sent to the next stage for
	// the whole batch (the gradient sent back has the same size).
	OutputBytes int64
}

// MemBytes is the training memory the layer needs on its device:
// StateCopies × parameters + activations.
func (l Layer) MemBytes() int64 { return StateCopies*l.ParamBytes + l.ActivationBytes }

// Model is a sequence of layers trained with a given batch.
type Model struct {
	// Name is informative only.
	Name string
	// Layers in execution order.
	Layers []Layer
	// Batch is the number of samples per iteration (informative: layer
	// costs are already for the whole batch).
	Batch int
	// MicroBatches is the number of micro-batches of the pipelined (GPipe)
	// schedule; 0 or 1 selects the paper's sequential schedule.
	MicroBatches int
}

// Validate checks that the model is usable.
func (m *Model) Validate() error {
	if len(m.Layers) == 0 {
		return errors.New("alloc: model has no layers")
	}
	for i, l := range m.Layers {
		if l.FwdFLOPs < 0 || l.BwdFLOPs < 0 || l.ParamBytes < 0 || l.ActivationBytes < 0 || l.OutputBytes < 0 {
			return fmt.Errorf("alloc: layer %d (%q): negative cost", i, l.Name)
		}
	}
	if m.MicroBatches < 0 {
		return errors.New("alloc: negative micro-batch count")
	}
	return nil
}

// Micro returns the number of micro-batches, at least 1.
func (m *Model) Micro() int { return max(1, m.MicroBatches) }

// Stage is a contiguous block of layers [First, Last) on one device.
type Stage struct {
	Device int `json:"device"`
	First  int `json:"first"`
	Last   int `json:"last"`
}

// Plan is a pipeline: stages in execution order, covering every layer
// exactly once. Devices not named by any stage are left out.
type Plan struct {
	Stages []Stage `json:"stages"`
}

// Validate checks contiguity: stages are non-empty, follow each other
// without gaps from layer 0 to nLayers, and use distinct devices.
func (p Plan) Validate(nDevices, nLayers int) error {
	if len(p.Stages) == 0 {
		return errors.New("alloc: plan has no stages")
	}
	used := make([]bool, nDevices)
	next := 0
	for k, s := range p.Stages {
		if s.Device < 0 || s.Device >= nDevices {
			return fmt.Errorf("alloc: stage %d: device %d out of range", k, s.Device)
		}
		if used[s.Device] {
			return fmt.Errorf("alloc: stage %d: device %d used twice", k, s.Device)
		}
		used[s.Device] = true
		if s.First != next || s.Last <= s.First {
			return fmt.Errorf("alloc: stage %d: layers [%d,%d) do not continue at %d", k, s.First, s.Last, next)
		}
		next = s.Last
	}
	if next != nLayers {
		return fmt.Errorf("alloc: plan covers %d of %d layers", next, nLayers)
	}
	return nil
}

// Problem is what a strategy solves.
type Problem struct {
	Cluster *Cluster
	Model   *Model
	// Objective selects what "skyhive" minimises and what Result.Predicted
	// reports. The zero value is ObjIteration.
	Objective Objective
}

func (p Problem) validate() error {
	if p.Cluster == nil || p.Model == nil {
		return errors.New("alloc: problem needs a cluster and a model")
	}
	if err := p.Cluster.Validate(); err != nil {
		return err
	}
	return p.Model.Validate()
}
