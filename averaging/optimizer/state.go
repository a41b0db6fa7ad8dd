package optimizer

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"

	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/skyhive/skyhive/averaging"
	"github.com/skyhive/skyhive/dht"
	"github.com/skyhive/skyhive/nn"
	"github.com/skyhive/skyhive/optim"
	"github.com/skyhive/skyhive/tensor"
)

// Layout is the shape of the state a peer serves: the model's parameters,
// then the optimizer's buffers sorted by name, as one vector.
type Layout struct {
	// Params is the number of model elements.
	Params int
	// ParamSizes lists the element counts of the parameters in order (nil:
	// the model is checked as one piece by Download).
	ParamSizes []int
	// Buffers names the optimizer buffers in order, with their shapes.
	Buffers []string
	Shapes  [][]int
	// Total is the number of elements of the whole vector.
	Total int
	// Hash covers every name and shape, so peers with another model or
	// optimizer do not exchange state.
	Hash uint64
}

// NewLayout returns the layout of params and the optimizer state st.
func NewLayout(params []*nn.Param, st optim.State) Layout {
	l := Layout{}
	h := uint64(0)
	for _, p := range params {
		l.Params += p.Value.Len()
		l.ParamSizes = append(l.ParamSizes, p.Value.Len())
		h = hashString(h, fmt.Sprintf("p %s %v", p.Name, p.Value.Shape))
	}
	l.Total = l.Params
	l.Buffers = slices.Sorted(maps.Keys(st.Tensors))
	for _, name := range l.Buffers {
		t := st.Tensors[name]
		l.Shapes = append(l.Shapes, slices.Clone(t.Shape))
		l.Total += t.Len()
		h = hashString(h, fmt.Sprintf("b %s %v", name, t.Shape))
	}
	l.Hash = h
	return l
}

// State is a peer's training state as served to a joiner.
type State struct {
	// Vector is the model, then the optimizer buffers (Layout order).
	Vector []float32
	// Round is the averaging round counter, OptStep the optimizer's step
	// counter and Epoch the swarm epoch the donor was in.
	Round, OptStep, Epoch int
}

// Model returns the model part of the state.
func (s State) Model(l Layout) []float32 { return s.Vector[:l.Params] }

// optimState rebuilds the optimizer state from the vector.
func (l Layout) optimState(s State) optim.State {
	st := optim.State{Step: int64(s.OptStep), Tensors: map[string]*tensor.Tensor{}}
	off := l.Params
	for i, name := range l.Buffers {
		t := tensor.New(l.Shapes[i]...)
		off += copy(t.Data, s.Vector[off:off+t.Len()])
		st.Tensors[name] = t
	}
	return st
}

// exportLocked flattens the model (with pending averages), the wrapped
// optimizer's state and the algorithm's buffers; o.mu must be held and no
// Step may run.
func (o *Optimizer) exportLocked() State {
	v := make([]float32, 0, o.layout.Total)
	v = append(v, o.snapshotLocked()...)
	st := withBuffers(o.inner.State(), o.alg.buffers())
	for _, name := range o.layout.Buffers {
		v = append(v, st.Tensors[name].Data...)
	}
	return State{Vector: v, Round: o.round, OptStep: int(st.Step), Epoch: o.prog.epoch()}
}

// ExportState returns this peer's state (model with pending averages,
// optimizer buffers, counters), as served to joiners; for checkpoints.
func (o *Optimizer) ExportState() State {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.exportLocked()
}

// exportServed is ExportState for a joiner's download, counted in
// Stats.StatesServed.
func (o *Optimizer) exportServed() State {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.stats.StatesServed++
	return o.exportLocked()
}

// LoadState installs a state (from Join, before the first Step): the
// model, the optimizer's buffers and step counter, the algorithm's
// buffers, the round counter and the swarm epoch.
func (o *Optimizer) LoadState(s State) error {
	if len(s.Vector) != o.layout.Total {
		return fmt.Errorf("averaging: state of %d elements, this model and optimizer have %d", len(s.Vector), o.layout.Total)
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.started {
		return errors.New("averaging: load state before the first Step")
	}
	st := o.layout.optimState(s)
	own := o.alg.buffers()
	loaded := map[string]*tensor.Tensor{}
	for name := range own {
		loaded[name] = st.Tensors[name]
		delete(st.Tensors, name)
	}
	if err := o.inner.LoadState(st); err != nil {
		return fmt.Errorf("averaging: %w", err)
	}
	for name, t := range own {
		copy(t.Data, loaded[name].Data)
	}
	nn.SetFlatValues(o.params, s.Vector[:o.n])
	copy(o.published, s.Vector[:o.n])
	clear(o.delta)
	o.round, o.stats.Round = s.Round, s.Round
	o.alg.resumeLocked(s.Round)
	o.prog.setEpoch(s.Epoch)
	return nil
}

// Join finds the peers of the run in the DHT and downloads the state
// (Download) from those training the same model, the most advanced first,
// then installs it (LoadState). It fails with a message naming the problem
// when the run has no listed peers, when they all train another model, or
// when no donor answers before ctx ends.
func (o *Optimizer) Join(ctx context.Context, node *dht.Node, cfg DownloadConfig) (Downloaded, error) {
	infos, err := averaging.FindPeers(ctx, node, o.cfg.RunID)
	if err != nil {
		return Downloaded{}, err
	}
	var same, other []averaging.PeerInfo
	for _, p := range infos {
		switch {
		case p.Addr.ID == o.avg.Transport().ID():
		case p.Model == o.cfg.Model:
			same = append(same, p)
		default:
			other = append(other, p)
		}
	}
	if len(same) == 0 {
		if len(other) > 0 {
			return Downloaded{}, fmt.Errorf("%w: the %d peers of run %q train model %q; this peer trains %q",
				ErrModelMismatch, len(other), o.cfg.RunID, other[0].Model, o.cfg.Model)
		}
		return Downloaded{}, fmt.Errorf("%w: run %q", ErrNoPeers, o.cfg.RunID)
	}
	slices.SortStableFunc(same, func(a, b averaging.PeerInfo) int { return b.Round - a.Round })
	cands := make([]peer.AddrInfo, len(same))
	for i, p := range same {
		cands[i] = p.Addr
	}
	d, err := Download(ctx, o.avg.Transport(), cands, o.layout, cfg)
	if err != nil {
		return d, err
	}
	return d, o.LoadState(d.State)
}

// Errors of Join.
var (
	// ErrNoPeers means no peer of the run is listed in the DHT.
	ErrNoPeers = errors.New("no peers of the run are listed in the DHT")
	// ErrModelMismatch means the run's peers train another model.
	ErrModelMismatch = errors.New("model differs from the run's")
)
