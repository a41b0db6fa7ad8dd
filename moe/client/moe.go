package client

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/skyhive/skyhive/moe"
	"github.com/skyhive/skyhive/nn"
	"github.com/skyhive/skyhive/p2p"
	"github.com/skyhive/skyhive/tensor"
	"github.com/skyhive/skyhive/wire"
)

// ErrNoExperts means a sample got no answer from any expert.
var ErrNoExperts = errors.New("moe/client: no expert answered for a sample")

// callErrors summarises the failed expert calls of one pass: the first
// error and how many calls failed, rather than every call's message (a
// misconfigured swarm fails all of them the same way). errors.Is and
// errors.As see every call's error.
func callErrors(errs []error) error {
	switch len(errs) {
	case 0:
		return errors.New("no expert of the grid was found on the DHT, or none answered in time")
	case 1:
		return errs[0]
	}
	return &manyErrors{errs: errs}
}

// manyErrors is what callErrors returns for several failed calls.
type manyErrors struct{ errs []error }

func (e *manyErrors) Error() string {
	return fmt.Sprintf("%d expert calls failed, the first: %v", len(e.errs), e.errs[0])
}

func (e *manyErrors) Unwrap() []error { return e.errs }

// Config configures a MixtureOfExperts.
type Config struct {
	// In is the input size (the experts' hidden size).
	In int
	// Search finds experts; its grid sets the gating outputs.
	Search *BeamSearch
	// Transport carries the expert calls.
	Transport p2p.Transport
	// KBest is the number of experts each sample is sent to (4); KMin is
	// how many answers per sample the forward pass waits for before
	// TimeoutAfterKMin starts (1).
	KBest, KMin int
	// ForwardTimeout bounds all forward calls of one pass (10s);
	// TimeoutAfterKMin is how long to keep waiting once every sample has
	// KMin answers (1s).
	ForwardTimeout, TimeoutAfterKMin time.Duration
	// BackwardTimeout bounds the backward calls (10s). BackwardKMin is the
	// number of expert gradients per sample below which BackwardCtx
	// reports an error (the gradient is still returned) (0).
	BackwardTimeout time.Duration
	BackwardKMin    int
	// AllowZeroOutputs makes samples with no answering expert output zeros
	// instead of failing the pass.
	AllowZeroOutputs bool
	// DeadFor is how long an expert whose call failed at the transport is
	// skipped by the beam search (5s; negative disables).
	DeadFor time.Duration
	// Codec encodes the tensors sent to experts.
	Codec wire.Codec
	// Seed seeds the gating network.
	Seed uint64
}

// MixtureOfExperts is Learning@home's DMoE layer. A gating Linear maps each
// sample to one score per grid coordinate; beam search picks the KBest
// highest-scoring live experts (an expert's score is the sum of its
// coordinates' scores); the sample is sent to them in parallel and their
// outputs are averaged with softmax weights over the experts that answered
// in time. Backward sends each expert its input and its weighted output
// gradient (the server updates the expert), and backpropagates the
// softmax weights into the gating network, whose gradient stays here.
//
// Inputs are [batch, In] or [batch, seq, In]; for the latter the gate sees
// the mean over the sequence. MixtureOfExperts implements nn.Module; its
// Forward and Backward use the configured timeouts and record errors that
// StateErr reports. ForwardCtx and BackwardCtx return them directly.
type MixtureOfExperts struct {
	cfg  Config
	Gate *nn.Linear

	deadMu sync.Mutex
	dead   map[string]time.Time
}

// New returns a mixture-of-experts layer.
func New(cfg Config) (*MixtureOfExperts, error) {
	if cfg.In < 1 || cfg.Search == nil || cfg.Transport == nil {
		return nil, errors.New("moe/client: Config needs In, Search and Transport")
	}
	def := func(v *int, d int) {
		if *v <= 0 {
			*v = d
		}
	}
	def(&cfg.KBest, 4)
	def(&cfg.KMin, 1)
	cfg.KMin = min(cfg.KMin, cfg.KBest)
	defd := func(v *time.Duration, d time.Duration) {
		if *v <= 0 {
			*v = d
		}
	}
	defd(&cfg.ForwardTimeout, 10*time.Second)
	defd(&cfg.TimeoutAfterKMin, time.Second)
	defd(&cfg.BackwardTimeout, 10*time.Second)
	if cfg.DeadFor == 0 {
		cfg.DeadFor = 5 * time.Second
	}
	rng := rand.New(rand.NewPCG(cfg.Seed, 0x6a7e))
	gate := nn.NewLinear(cfg.In, cfg.Search.Grid().TotalSize(), nn.XavierStd(cfg.In, cfg.Search.Grid().TotalSize()), rng)
	return &MixtureOfExperts{cfg: cfg, Gate: gate, dead: map[string]time.Time{}}, nil
}

// In is the layer's input size, the experts' hidden size.
func (m *MixtureOfExperts) In() int { return m.cfg.In }

// Params returns the gating network's parameters ("gate.weight",
// "gate.bias"); the experts' parameters live on their servers.
func (m *MixtureOfExperts) Params() []*nn.Param {
	ps := m.Gate.Params()
	out := make([]*nn.Param, len(ps))
	for i, p := range ps {
		out[i] = &nn.Param{Name: "gate." + p.Name, Value: p.Value, Grad: p.Grad}
	}
	return out
}

// Cost counts the gate only: expert work happens on the servers.
func (m *MixtureOfExperts) Cost(in []int) nn.Cost {
	c := m.Gate.Cost([]int{in[0], m.cfg.In})
	c.OutShape = append([]int(nil), in...)
	return c
}

// call is one expert's share of a batch.
type call struct {
	expert *RemoteExpert
	rows   []int // sample indices
	x      *tensor.Tensor
	out    *tensor.Tensor
	err    error
}

// choice is one answering expert of one sample.
type choice struct {
	call  *call
	pos   int // row within call
	cands []int
	p     float32
}

type moeState struct {
	x       *tensor.Tensor
	gateIn  *tensor.Tensor
	gateSt  nn.State
	calls   []*call
	choices [][]choice // per sample, answering experts
	err     error
	// Answered counts the answering experts of each sample.
	answered []int
}

// StateErr returns the error recorded by MixtureOfExperts.Forward or
// Backward in st, or nil.
func StateErr(st nn.State) error {
	if s, ok := st.(*moeState); ok {
		return s.err
	}
	return nil
}

// Answered returns how many experts answered each sample of the forward
// pass that produced st.
func Answered(st nn.State) []int {
	if s, ok := st.(*moeState); ok {
		return s.answered
	}
	return nil
}

func (m *MixtureOfExperts) isDead(uid string) bool {
	m.deadMu.Lock()
	defer m.deadMu.Unlock()
	t, ok := m.dead[uid]
	if ok && time.Now().After(t) {
		delete(m.dead, uid)
		return false
	}
	return ok
}

func (m *MixtureOfExperts) markDead(err error) {
	var ee *ExpertError
	var re *p2p.RemoteError
	if m.cfg.DeadFor < 0 || !errors.As(err, &ee) || errors.As(err, &re) {
		return // a remote error means the server is alive
	}
	m.deadMu.Lock()
	m.dead[ee.UID] = time.Now().Add(m.cfg.DeadFor)
	m.deadMu.Unlock()
}

// Forward implements nn.Module with a background context; check StateErr.
func (m *MixtureOfExperts) Forward(_ nn.Ctx, x *tensor.Tensor) (*tensor.Tensor, nn.State) {
	y, st, err := m.ForwardCtx(context.Background(), x)
	if st == nil {
		st = &moeState{err: err}
	}
	if y == nil {
		y = tensor.New(x.Shape...)
	}
	return y, st
}

// Backward implements nn.Module with a background context; check StateErr.
func (m *MixtureOfExperts) Backward(st nn.State, dy *tensor.Tensor) *tensor.Tensor {
	dx, err := m.BackwardCtx(context.Background(), st, dy)
	if s, ok := st.(*moeState); ok && err != nil {
		s.err = err
	}
	return dx
}

func (m *MixtureOfExperts) gateInput(x *tensor.Tensor) (*tensor.Tensor, error) {
	n, in := x.Shape[0], x.Shape[len(x.Shape)-1]
	if in != m.cfg.In || (len(x.Shape) != 2 && len(x.Shape) != 3) {
		return nil, fmt.Errorf("moe/client: input shape %v, want [batch, %d] or [batch, seq, %d]", x.Shape, m.cfg.In, m.cfg.In)
	}
	if len(x.Shape) == 2 {
		return x, nil
	}
	seq := x.Shape[1]
	g := tensor.New(n, in)
	for i := range n {
		for s := range seq {
			tensor.Axpy(1/float32(seq), x.Data[(i*seq+s)*in:(i*seq+s+1)*in], g.Data[i*in:(i+1)*in])
		}
	}
	return g, nil
}

// ForwardCtx runs the layer: gate, beam search, parallel expert calls and
// the softmax-weighted combination of the answers. Expert failures are
// tolerated; the error reports samples left with no answer.
func (m *MixtureOfExperts) ForwardCtx(ctx context.Context, x *tensor.Tensor) (*tensor.Tensor, nn.State, error) {
	gin, err := m.gateInput(x)
	if err != nil {
		return nil, nil, err
	}
	n := x.Shape[0]
	if n == 0 {
		return nil, nil, errors.New("moe/client: empty batch")
	}
	scores, gst := m.Gate.Forward(nn.Ctx{}, gin)
	cands := m.cfg.Search.FindBest(ctx, n, m.gridScores(scores, n), m.cfg.KBest, m.isDead)
	calls, refs := groupCalls(x, cands, m.newExpert)
	okCalls, errs := m.callExperts(ctx, calls, cands)

	st := &moeState{x: x, gateIn: gin, gateSt: gst, calls: calls, choices: make([][]choice, n), answered: make([]int, n)}
	y, zero := combine(x, cands, refs, okCalls, st)
	if zero > 0 && !m.cfg.AllowZeroOutputs {
		st.err = fmt.Errorf("%w: %d of %d samples: %w", ErrNoExperts, zero, n, callErrors(errs))
		return y, st, st.err
	}
	return y, st, nil
}

// gridScores splits the gate's scores of n samples into one score vector
// per grid dimension, as the beam search takes them.
func (m *MixtureOfExperts) gridScores(scores *tensor.Tensor, n int) [][]float32 {
	grid := m.cfg.Search.Grid()
	perDim := make([][]float32, len(grid.Size))
	off := 0
	for d, size := range grid.Size {
		perDim[d] = make([]float32, n*size)
		for i := range n {
			copy(perDim[d][i*size:(i+1)*size], scores.Data[i*scores.Shape[1]+off:])
		}
		off += size
	}
	return perDim
}

// newExpert is the remote expert a call of the layer goes to.
func (m *MixtureOfExperts) newExpert(info moe.ExpertInfo) *RemoteExpert {
	return &RemoteExpert{UID: info.UID, Peer: info.Peer, Transport: m.cfg.Transport, Codec: m.cfg.Codec}
}

// callRef is where one candidate expert of a sample is in the calls: the
// call and the sample's row within it.
type callRef struct {
	c   *call
	pos int
}

// groupCalls groups the samples of x by expert: one call per expert that
// any sample chose, holding the rows of the samples that chose it, and for
// each sample where its candidates' rows are.
func groupCalls(x *tensor.Tensor, cands [][]Candidate, newExpert func(moe.ExpertInfo) *RemoteExpert) ([]*call, [][]callRef) {
	n := x.Shape[0]
	row := x.Len() / n
	byUID := map[string]*call{}
	var calls []*call
	refs := make([][]callRef, n)
	for i, cs := range cands {
		for _, c := range cs {
			cl := byUID[c.Info.UID]
			if cl == nil {
				cl = &call{expert: newExpert(c.Info)}
				byUID[c.Info.UID] = cl
				calls = append(calls, cl)
			}
			refs[i] = append(refs[i], callRef{cl, len(cl.rows)})
			cl.rows = append(cl.rows, i)
		}
	}
	for _, cl := range calls {
		shape := append([]int{len(cl.rows)}, x.Shape[1:]...)
		cl.x = tensor.New(shape...)
		for j, i := range cl.rows {
			copy(cl.x.Data[j*row:(j+1)*row], x.Data[i*row:(i+1)*row])
		}
	}
	return calls, refs
}

// callExperts calls the experts and waits: for all of them, for
// ForwardTimeout, or for TimeoutAfterKMin once every sample has KMin
// answers. It returns the calls that answered and the errors of those
// that failed; experts that failed or were too slow are marked dead.
func (m *MixtureOfExperts) callExperts(ctx context.Context, calls []*call, cands [][]Candidate) (map[*call]bool, []error) {
	fctx, cancel := context.WithTimeout(ctx, m.cfg.ForwardTimeout)
	defer cancel()
	done := make(chan *call, len(calls))
	for _, cl := range calls {
		go func() {
			cl.out, _, cl.err = cl.expert.Forward(fctx, cl.x)
			done <- cl
		}()
	}
	answered := make([]int, len(cands))
	okCalls := map[*call]bool{}
	need := 0 // samples still below KMin
	for _, cs := range cands {
		if len(cs) > 0 {
			need++
		}
	}
	var after <-chan time.Time
	var timer *time.Timer
	if need == 0 {
		timer = time.NewTimer(0)
		after = timer.C
	}
	pending := len(calls)
	var errs []error
	collect := func(cl *call) {
		pending--
		if cl.err != nil {
			errs = append(errs, cl.err)
			if ctx.Err() == nil {
				m.markDead(cl.err)
			}
			return
		}
		okCalls[cl] = true
		for _, i := range cl.rows {
			answered[i]++
			if answered[i] == min(m.cfg.KMin, len(cands[i])) {
				need--
			}
		}
	}
wait:
	for pending > 0 {
		select {
		case cl := <-done:
			collect(cl)
			if need == 0 && after == nil {
				timer = time.NewTimer(m.cfg.TimeoutAfterKMin)
				after = timer.C
			}
		case <-after:
			break wait
		case <-fctx.Done():
			break wait
		}
	}
	cancel()
	if timer != nil {
		timer.Stop()
	}
	for pending > 0 { // the cancelled calls return promptly
		cl := <-done
		pending--
		if cl.err != nil && ctx.Err() == nil {
			// Too slow: considered unavailable for a while.
			m.markDead(cl.err)
		}
	}
	return okCalls, errs
}

// combine is the layer's output: for each sample, the softmax over its
// answering experts' scores weighting their answers. It records each
// sample's choices in st and returns how many samples no expert answered
// (their output rows are zeros).
func combine(x *tensor.Tensor, cands [][]Candidate, refs [][]callRef, okCalls map[*call]bool, st *moeState) (*tensor.Tensor, int) {
	n := x.Shape[0]
	row := x.Len() / n
	y := tensor.New(x.Shape...)
	var zero int
	for i := range n {
		var ch []choice
		maxS := float32(math.Inf(-1))
		for k, r := range refs[i] {
			if okCalls[r.c] {
				ch = append(ch, choice{call: r.c, pos: r.pos, cands: cands[i][k].Coords, p: cands[i][k].Score})
				maxS = max(maxS, cands[i][k].Score)
			}
		}
		if len(ch) == 0 {
			zero++
			continue
		}
		var sum float32
		for k := range ch {
			ch[k].p = float32(math.Exp(float64(ch[k].p - maxS)))
			sum += ch[k].p
		}
		yi := y.Data[i*row : (i+1)*row]
		for k := range ch {
			ch[k].p /= sum
			tensor.Axpy(ch[k].p, ch[k].call.out.Data[ch[k].pos*row:(ch[k].pos+1)*row], yi)
		}
		st.choices[i] = ch
		st.answered[i] = len(ch)
	}
	return y, zero
}

// BackwardCtx returns the gradient with respect to the input, accumulates
// the gating network's gradients, and sends every answering expert its
// input and weighted output gradient (the servers apply them). Experts that
// fail or time out contribute no input gradient.
func (m *MixtureOfExperts) BackwardCtx(ctx context.Context, s nn.State, dy *tensor.Tensor) (*tensor.Tensor, error) {
	st, ok := s.(*moeState)
	if !ok || st.x == nil {
		return nil, errors.New("moe/client: Backward needs the state of a successful Forward")
	}
	x := st.x
	n := x.Shape[0]
	row := x.Len() / n
	grid := m.cfg.Search.Grid()
	offs := make([]int, len(grid.Size))
	for d := 1; d < len(offs); d++ {
		offs[d] = offs[d-1] + grid.Size[d-1]
	}
	total := grid.TotalSize()
	dscores := tensor.New(n, total)
	douts := map[*call]*tensor.Tensor{}
	for i := range n {
		ch := st.choices[i]
		if len(ch) == 0 {
			continue
		}
		dyi := dy.Data[i*row : (i+1)*row]
		dp := make([]float32, len(ch))
		var dot float32
		for k, c := range ch {
			dp[k] = tensor.Dot(dyi, c.call.out.Data[c.pos*row:(c.pos+1)*row])
			dot += c.p * dp[k]
		}
		for k, c := range ch {
			dl := c.p * (dp[k] - dot)
			for d, coord := range c.cands {
				dscores.Data[i*total+offs[d]+coord] += dl
			}
			do := douts[c.call]
			if do == nil {
				do = tensor.New(c.call.x.Shape...)
				douts[c.call] = do
			}
			tensor.Axpy(c.p, dyi, do.Data[c.pos*row:(c.pos+1)*row])
		}
	}
	dgate := m.Gate.Backward(st.gateSt, dscores)
	dx := tensor.New(x.Shape...)
	if len(x.Shape) == 2 {
		copy(dx.Data, dgate.Data)
	} else {
		seq, in := x.Shape[1], x.Shape[2]
		for i := range n {
			for p := range seq {
				tensor.Axpy(1/float32(seq), dgate.Data[i*in:(i+1)*in], dx.Data[(i*seq+p)*in:(i*seq+p+1)*in])
			}
		}
	}

	got, errs := m.sendBackward(ctx, douts, dx)
	return dx, m.checkBackwardKMin(got, func(i int) bool { return len(st.choices[i]) > 0 }, errs)
}

// sendBackward sends each call's output gradient to its expert, within
// BackwardTimeout, and adds the input gradients that come back to dx. It
// returns how many expert gradients each sample got and the failures.
func (m *MixtureOfExperts) sendBackward(ctx context.Context, douts map[*call]*tensor.Tensor, dx *tensor.Tensor) ([]int, []error) {
	n := dx.Shape[0]
	row := dx.Len() / n
	bctx, cancel := context.WithTimeout(ctx, m.cfg.BackwardTimeout)
	defer cancel()
	type res struct {
		cl  *call
		dx  *tensor.Tensor
		err error
	}
	done := make(chan res, len(douts))
	for cl, do := range douts {
		go func() {
			g, err := cl.expert.Backward(bctx, cl.x, do)
			done <- res{cl, g, err}
		}()
	}
	got := make([]int, n)
	var errs []error
	for range douts {
		r := <-done
		if r.err != nil {
			errs = append(errs, r.err)
			if ctx.Err() == nil {
				m.markDead(r.err)
			}
			continue
		}
		for j, i := range r.cl.rows {
			got[i]++
			tensor.Axpy(1, r.dx.Data[j*row:(j+1)*row], dx.Data[i*row:(i+1)*row])
		}
	}
	return got, errs
}

// checkBackwardKMin reports the samples that had experts (chose) and got
// fewer than BackwardKMin expert gradients.
func (m *MixtureOfExperts) checkBackwardKMin(got []int, chose func(i int) bool, errs []error) error {
	if m.cfg.BackwardKMin <= 0 {
		return nil
	}
	short := 0
	for i, g := range got {
		if chose(i) && g < m.cfg.BackwardKMin {
			short++
		}
	}
	if short > 0 {
		return fmt.Errorf("moe/client: %d samples got fewer than %d expert gradients: %w", short, m.cfg.BackwardKMin, callErrors(errs))
	}
	return nil
}

var _ nn.Module = (*MixtureOfExperts)(nil)
