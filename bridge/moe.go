package bridge

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/skyhive/skyhive/averaging/peer"
	"github.com/skyhive/skyhive/launch"
	"github.com/skyhive/skyhive/metrics"
	"github.com/skyhive/skyhive/moe"
	"github.com/skyhive/skyhive/moe/client"
	"github.com/skyhive/skyhive/node"
	"github.com/skyhive/skyhive/tensor"
)

// Modes of a session (hello's mode).
const (
	// ModeAveraging (the default) averages a model: skyhive.Optimizer.
	ModeAveraging = "averaging"
	// ModeMoE calls remote experts for a mixture-of-experts layer whose
	// gate the client computes: skyhive.RemoteMixtureOfExperts.
	ModeMoE = "moe"
)

// Operations of a MoE session.
const (
	OpMoEForward  = "moe_forward"
	OpMoEOut      = "moe_out"
	OpMoEBackward = "moe_backward"
	OpMoEDX       = "moe_dx"
	OpMoERelease  = "moe_release"
)

// KindExperts: too few experts answered (no answer for a sample in a
// forward pass, fewer than backward_k_min gradients in a backward pass);
// the session goes on.
const KindExperts = "experts"

// Bounds of a MoE session.
const (
	// MaxMoERows bounds the samples of one call.
	MaxMoERows = 1 << 14
	// MaxKBest bounds the experts per sample.
	MaxKBest = 64
	// moeKept is how many forward passes a session keeps for their
	// backward pass; older ones are dropped (their backward is refused).
	moeKept = 64
)

// MoEOptions configure a MoE session (hello's moe), with hivemind's names.
type MoEOptions struct {
	// UIDPrefix and GridSize name the experts' grid ("ffn", [4, 2]: the
	// experts ffn.0.0 … ffn.3.1 that `skyhive server --experts
	// 'ffn.[0:4].[0:2]'` hosts).
	UIDPrefix string `json:"uid_prefix"`
	GridSize  []int  `json:"grid_size"`
	// InFeatures is the experts' hidden size; RowElements the elements of
	// one sample (InFeatures for [rows, hidden] inputs, seq·hidden for
	// [rows, seq, hidden]; the largest, when it varies).
	InFeatures  int `json:"in_features"`
	RowElements int `json:"row_elements"`
	// MaxRows bounds the samples of one call (1024).
	MaxRows int `json:"max_rows"`
	// KBest, KMin, BackwardKMin, the timeouts (seconds) and
	// AllowZeroOutputs are moe/client.Config's.
	KBest            int     `json:"k_best"`
	KMin             int     `json:"k_min"`
	BackwardKMin     int     `json:"backward_k_min"`
	ForwardTimeout   float64 `json:"forward_timeout"`
	TimeoutAfterKMin float64 `json:"timeout_after_k_min"`
	BackwardTimeout  float64 `json:"backward_timeout"`
	AllowZeroOutputs bool    `json:"allow_zero_outputs"`
}

// check validates o and returns the grid and the region's layout: the
// inputs (and input gradients), the answers (and their gradients), the
// scores.
func (o *MoEOptions) check(maxElements int) (moe.Grid, moeLayout, error) {
	grid := moe.Grid{Prefix: strings.TrimSuffix(o.UIDPrefix, moe.Delimiter), Size: o.GridSize}
	if err := grid.Validate(); err != nil {
		return grid, moeLayout{}, fmt.Errorf("uid_prefix %q and grid_size %v: %w", o.UIDPrefix, o.GridSize, err)
	}
	if o.MaxRows == 0 {
		o.MaxRows = 1024
	}
	if o.RowElements == 0 {
		o.RowElements = o.InFeatures
	}
	switch {
	case o.InFeatures < 1 || o.InFeatures > 1<<16:
		return grid, moeLayout{}, fmt.Errorf("in_features %d: want 1 to %d", o.InFeatures, 1<<16)
	case o.RowElements < o.InFeatures || o.RowElements > maxElements || o.RowElements%o.InFeatures != 0:
		return grid, moeLayout{}, fmt.Errorf("row_elements %d: want a multiple of in_features %d, at most %d", o.RowElements, o.InFeatures, maxElements)
	case o.MaxRows < 1 || o.MaxRows > MaxMoERows:
		return grid, moeLayout{}, fmt.Errorf("max_rows %d: want 1 to %d", o.MaxRows, MaxMoERows)
	case o.KBest < 1 || o.KBest > MaxKBest:
		return grid, moeLayout{}, fmt.Errorf("k_best %d: want 1 to %d", o.KBest, MaxKBest)
	case o.KMin < 0 || o.KMin > o.KBest || o.BackwardKMin < 0 || o.BackwardKMin > o.KBest:
		return grid, moeLayout{}, fmt.Errorf("k_min %d and backward_k_min %d: want 0 to k_best (%d)", o.KMin, o.BackwardKMin, o.KBest)
	case o.ForwardTimeout < 0 || o.TimeoutAfterKMin < 0 || o.BackwardTimeout < 0 ||
		o.ForwardTimeout > 3600 || o.TimeoutAfterKMin > 3600 || o.BackwardTimeout > 3600:
		return grid, moeLayout{}, errors.New("timeouts: want 0 (the default) to 3600 seconds")
	}
	l := moeLayout{in: o.InFeatures, row: o.RowElements, k: o.KBest, total: grid.TotalSize(), rows: o.MaxRows}
	l.out = l.rows * l.row
	l.scores = l.out + l.rows*l.k*l.row
	l.elements = l.scores + l.rows*l.total
	if int64(l.rows)*int64(l.row)*int64(l.k+1)+int64(l.rows)*int64(l.total) > int64(maxElements) {
		return grid, moeLayout{}, fmt.Errorf("max_rows %d of %d elements with k_best %d need more than the %d elements a session may map: lower max_rows", l.rows, l.row, l.k, maxElements)
	}
	return grid, l, nil
}

// moeLayout is where a MoE session's tensors are in its region (element
// offsets): inputs at 0 (input gradients there too, after a backward
// pass), answers at out (sample i's j-th expert at (i·k+j)·row; their
// gradients there too, before a backward pass), scores at scores (sample
// i's, total of them, at i·total).
type moeLayout struct {
	in, row, k, total, rows int
	out, scores             int
	elements                int
}

// runMoE serves a MoE session after its hello.
func (s *session) runMoE(ctx context.Context, hello Message) error {
	if hello.Version != Version {
		return s.fail(KindConfig, fmt.Errorf("the client speaks protocol version %d, this daemon %d: use the Python package and the skyhive binary of one release", hello.Version, Version))
	}
	if hello.MoE == nil {
		return s.fail(KindConfig, errors.New("a moe session needs its options (moe)"))
	}
	opts := *hello.MoE
	grid, lay, err := opts.check(s.cfg.MaxElements)
	if err != nil {
		return s.fail(KindConfig, err)
	}
	netOpts, err := decodeNet(hello.Options)
	if err != nil {
		return s.fail(KindConfig, err)
	}
	if len(netOpts.DHT) == 0 {
		return s.fail(KindConfig, launch.NewFieldError(nil, "%s is required: the multiaddr of a `skyhive dht` node or of an expert server, ending in /p2p/PEER_ID", "dht"))
	}
	host, err := node.HostConfig(netOpts)
	if err != nil {
		return s.fail(KindConfig, err)
	}
	host.MaxMessageBytes = 256 << 20
	ncfg := node.FromLaunch(host, netOpts, launch.Process{}, metrics.RoleTrainer)
	ncfg.DHT.Mode, ncfg.Log = node.DHTClient, s.cfg.Log
	n, err := node.New(ctx, ncfg)
	if err != nil {
		return s.fail(KindSwarm, err)
	}
	defer n.Close()
	search, err := client.NewBeamSearch(n.DHT(), grid, opts.KBest, 0)
	if err != nil {
		return s.fail(KindConfig, err)
	}
	sec := func(v float64) time.Duration { return time.Duration(v * float64(time.Second)) }
	layer, err := client.New(client.Config{In: opts.InFeatures, Search: search, Transport: n.Host(),
		KBest: opts.KBest, KMin: opts.KMin, BackwardKMin: opts.BackwardKMin, ForwardTimeout: sec(opts.ForwardTimeout),
		TimeoutAfterKMin: sec(opts.TimeoutAfterKMin), BackwardTimeout: sec(opts.BackwardTimeout), AllowZeroOutputs: opts.AllowZeroOutputs})
	if err != nil {
		return s.fail(KindConfig, err)
	}
	if s.region, err = newRegion(lay.elements); err != nil {
		return s.fail(KindConfig, err)
	}
	defer s.region.close()
	fd := s.region.fd
	if err := writeMessage(s.conn, Message{Op: OpShm, Elements: lay.elements, Bytes: 4 * lay.elements,
		Peer: n.ID().String(), Addrs: addrs(n.Host())}, &fd); err != nil {
		return err
	}
	logf(s.cfg.Log, "moe session: peer %s calls experts %s.%v (k_best %d)", n.ID(), grid.Prefix, grid.Size, opts.KBest)
	m := &moeSession{session: s, layer: layer, lay: lay, grid: grid, kept: map[int]*client.Dispatch{}}
	return m.serve(ctx)
}

// decodeNet decodes a MoE session's network options (launch.Net's fields)
// over `skyhive peer`'s defaults.
func decodeNet(b []byte) (launch.Net, error) {
	l := peer.Defaults().Net
	if len(bytes.TrimSpace(b)) == 0 || string(bytes.TrimSpace(b)) == "null" {
		return l, nil
	}
	d := json.NewDecoder(bytes.NewReader(b))
	d.DisallowUnknownFields()
	if err := d.Decode(&l); err != nil {
		return l, fmt.Errorf("options: %w (the network options of `skyhive peer`, with _ for -)", err)
	}
	return l, nil
}

// moeSession is a MoE session's state: the layer and the forward passes
// kept for their backward pass.
type moeSession struct {
	*session
	layer *client.MixtureOfExperts
	lay   moeLayout
	grid  moe.Grid
	next  int
	kept  map[int]*client.Dispatch
	order []int
}

func (m *moeSession) serve(ctx context.Context) error {
	for {
		msg, err := m.read()
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
		var reply Message
		switch msg.Op {
		case OpMoEForward:
			reply, err = m.forward(ctx, msg)
		case OpMoEBackward:
			reply, err = m.backward(ctx, msg)
		case OpMoERelease:
			m.release(msg.Call)
			continue // no answer
		case OpClose:
			return m.reply(Message{Op: OpClosed})
		default:
			return m.fail(KindProtocol, fmt.Errorf("%w: got %q in a moe session", ErrProtocol, msg.Op))
		}
		if err != nil {
			var ke *kindError
			if !errors.As(err, &ke) {
				return m.fail(KindProtocol, err)
			}
			reply = errorMessage(ke.kind, ke.err)
		}
		if err := m.reply(reply); err != nil {
			return err
		}
	}
}

// kindError is a refused call of a session that goes on.
type kindError struct {
	kind string
	err  error
}

func (e *kindError) Error() string { return e.err.Error() }

func refuse(kind string, format string, args ...any) error {
	return &kindError{kind: kind, err: fmt.Errorf(format, args...)}
}

// input checks a call's input shape against the layout: [rows, in] or
// [rows, seq, in], at most the layout's rows of at most its row elements.
// It returns the rows.
func (l moeLayout) input(shape []int) (int, error) {
	if len(shape) < 2 || len(shape) > 3 {
		return 0, refuse(KindValue, "input of shape %v: want [rows, %d] or [rows, seq, %d]", shape, l.in, l.in)
	}
	n := 1
	for _, d := range shape {
		if d < 1 || d > l.rows*l.row {
			return 0, refuse(KindValue, "input of shape %v", shape)
		}
		n *= d
		if n > l.rows*l.row {
			break
		}
	}
	rows := shape[0]
	if shape[len(shape)-1] != l.in || rows > l.rows || n > rows*l.row {
		return 0, refuse(KindValue, "input of shape %v: want at most %d rows of at most %d elements ending in %d (max_rows, row_elements, in_features)", shape, l.rows, l.row, l.in)
	}
	return rows, nil
}

// forward reads the input and the scores, calls the experts and writes
// their answers.
func (m *moeSession) forward(ctx context.Context, msg Message) (Message, error) {
	rows, err := m.lay.input(msg.Shape)
	if err != nil {
		return Message{}, err
	}
	x := tensor.New(msg.Shape...)
	copy(x.Data, m.region.floats(0, x.Len()))
	total := m.lay.total
	flat := m.region.floats(m.lay.scores, rows*total)
	if i := firstNonFinite(x.Data); i >= 0 {
		return Message{}, refuse(KindValue, "input element %d is not finite", i)
	}
	if i := firstNonFinite(flat); i >= 0 {
		return Message{}, refuse(KindValue, "gate score %d is not finite", i)
	}
	scores := make([][]float32, len(m.grid.Size))
	off := 0
	for d, size := range m.grid.Size {
		scores[d] = make([]float32, rows*size)
		for i := range rows {
			copy(scores[d][i*size:(i+1)*size], flat[i*total+off:])
		}
		off += size
	}
	d, err := m.layer.DispatchCtx(ctx, x, scores)
	if err != nil && d == nil {
		return Message{}, refuse(KindValue, "%v", err)
	}
	row := x.Len() / rows
	out := m.region.floats(m.lay.out, rows*m.lay.k*m.lay.row)
	clear(out)
	reply := Message{Op: OpMoEOut, Coords: make([][][]int, rows), Answered: make([][]bool, rows)}
	for i := range rows {
		for j, c := range d.Candidates(i) {
			reply.Coords[i] = append(reply.Coords[i], c.Coords)
			o := d.Output(i, j)
			reply.Answered[i] = append(reply.Answered[i], o != nil)
			if o != nil {
				copy(out[(i*m.lay.k+j)*m.lay.row:], o[:row])
			}
		}
	}
	if err != nil {
		return Message{}, refuse(KindExperts, "%v", err)
	}
	if msg.Keep {
		reply.Call = m.keep(d)
	}
	return reply, nil
}

// keep stores d for its backward pass, dropping the oldest beyond
// moeKept.
func (m *moeSession) keep(d *client.Dispatch) int {
	m.next++
	m.kept[m.next] = d
	m.order = append(m.order, m.next)
	if len(m.order) > moeKept {
		delete(m.kept, m.order[0])
		m.order = m.order[1:]
	}
	return m.next
}

func (m *moeSession) release(id int) {
	delete(m.kept, id)
}

// backward sends the answers' gradients to the experts and writes the
// input's gradient.
func (m *moeSession) backward(ctx context.Context, msg Message) (Message, error) {
	d := m.kept[msg.Call]
	if d == nil {
		return Message{}, refuse(KindValue, "forward pass %d is not kept (released, or more than %d forward passes since): run the backward pass sooner", msg.Call, moeKept)
	}
	m.release(msg.Call)
	x := d.Input()
	rows := x.Shape[0]
	row := x.Len() / rows
	grads := m.region.floats(m.lay.out, rows*m.lay.k*m.lay.row)
	if i := firstNonFinite(grads); i >= 0 {
		return Message{}, refuse(KindValue, "gradient element %d is not finite", i)
	}
	dx, _, err := m.layer.DispatchBackward(ctx, d, func(i, j int) []float32 {
		off := (i*m.lay.k + j) * m.lay.row
		return grads[off : off+row]
	})
	copy(m.region.floats(0, dx.Len()), dx.Data)
	if err != nil {
		return Message{}, refuse(KindExperts, "%v", err)
	}
	return Message{Op: OpMoEDX, Shape: x.Shape}, nil
}
