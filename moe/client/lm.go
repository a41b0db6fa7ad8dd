package client

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"time"

	"github.com/skyhive/skyhive/moe"
	"github.com/skyhive/skyhive/nn"
	"github.com/skyhive/skyhive/p2p"
	"github.com/skyhive/skyhive/tensor"
)

// LMConfig describes a DMoE transformer language model (see LM): a GPT
// whose feed-forward sub-blocks are mixtures of remote experts, as in
// Learning@home's language-modelling experiment.
type LMConfig struct {
	// Vocab is the token vocabulary, Seq the longest sequence the model
	// takes, Hidden the residual width (and the experts' hidden size) and
	// Heads the attention heads (Hidden must be divisible by Heads).
	Vocab, Seq, Hidden, Heads int
	// Grids are the expert grids, one per decoder block; their experts must
	// be of type server.TypeFFN with hidden size Hidden.
	Grids []moe.Grid
	// Untied gives the model its own output projection Linear(Hidden,
	// Vocab) instead of reusing the token embedding's table.
	Untied bool
	// Layer is the template of every DMoE layer's configuration (KBest,
	// KMin, timeouts, DeadFor, AllowZeroOutputs, Codec); Build fills in
	// In, Search, Transport and Seed.
	Layer Config
	// BeamSize is the width of each layer's beam search (0: Layer.KBest,
	// or 4); CacheTTL is how long it caches DHT prefix records.
	BeamSize int
	CacheTTL time.Duration
	// Seed seeds the local layers and the gates.
	Seed uint64
}

// Validate reports a configuration that cannot be built.
func (c LMConfig) Validate() error {
	if c.Vocab < 1 || c.Seq < 1 || c.Hidden < 1 || c.Heads < 1 || c.Hidden%c.Heads != 0 {
		return fmt.Errorf("moe/client: LM needs positive Vocab (%d), Seq (%d), Hidden (%d) and Heads (%d) dividing Hidden",
			c.Vocab, c.Seq, c.Hidden, c.Heads)
	}
	if len(c.Grids) == 0 {
		return errors.New("moe/client: LM needs at least one expert grid (one per block)")
	}
	for i, g := range c.Grids {
		if err := g.Validate(); err != nil {
			return fmt.Errorf("moe/client: LM block %d: %w", i, err)
		}
	}
	return nil
}

// Build returns an LM whose DMoE layers find experts through d and call
// them over tr.
func (c LMConfig) Build(d Getter, tr p2p.Transport) (*LM, error) {
	if err := c.Validate(); err != nil {
		return nil, err
	}
	beam := c.BeamSize
	if beam <= 0 {
		beam = c.Layer.KBest
	}
	layers := make([]Config, len(c.Grids))
	for i, g := range c.Grids {
		bs, err := NewBeamSearch(d, g, beam, c.CacheTTL)
		if err != nil {
			return nil, err
		}
		l := c.Layer
		l.In, l.Search, l.Transport = c.Hidden, bs, tr
		layers[i] = l
	}
	return NewLM(c, layers)
}

// LMBlock is one decoder block of an LM on the residual stream x of shape
// [batch, seq, hidden]:
//
//	h = x + CausalAttention(LN1(x))
//	y = DMoE(h)   with every expert computing h + FFN(LN(h))
//
// Learning@home's FFN experts hold the block's second LayerNorm and its
// residual connection themselves, and the softmax weights of the experts
// that answered sum to one, so y = h + Σₖ pₖ·FFNₖ(LNₖ(h)): nn.DecoderLayer's
// pre-LN feed-forward sub-block with the FFN replaced by a mixture of
// experts. Every token position is routed on its own (the layer sees
// [batch·seq, hidden]), so the gate of position t depends on no later
// position and the model stays causal. A position that no expert answered
// (possible only with Config.AllowZeroOutputs) passes through as y = h.
type LMBlock struct {
	LN1  *nn.LayerNorm
	Attn *nn.MultiHeadAttention
	MoE  *MixtureOfExperts
}

// LM is the trainer side of a DMoE transformer language model on
// [batch, seq] float32 token ids, giving [batch, seq, Vocab] next-token
// logits: token and learned position embeddings, LMBlocks, a final
// LayerNorm and an output head (tied to the token embedding unless
// LMConfig.Untied), trained with nn.SequenceCrossEntropy. Only the
// embeddings, attention, LayerNorms, head and gates have parameters here;
// the experts are trained by their servers from the backward calls.
// Several Predict calls may run at once.
type LM struct {
	cfg    LMConfig
	Embed  *nn.Embedding
	Pos    *nn.PositionalEmbedding
	Blocks []*LMBlock
	LN     *nn.LayerNorm
	// Head is an *nn.TiedHead or, with LMConfig.Untied, an *nn.Linear.
	Head nn.Module
}

// NewLM builds an LM with GPT-2's initialisation (N(0, 0.02²) tables and
// projections, the attention output scaled by 1/√(2·blocks)); layers are
// the DMoE configurations, one per grid of cfg, each with In equal to
// cfg.Hidden and a Search over that grid.
func NewLM(cfg LMConfig, layers []Config) (*LM, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if len(layers) != len(cfg.Grids) {
		return nil, fmt.Errorf("moe/client: LM has %d grids but %d DMoE layers", len(cfg.Grids), len(layers))
	}
	const std = 0.02
	rng := rand.New(rand.NewPCG(cfg.Seed, 0x1a4e))
	m := &LM{
		cfg:   cfg,
		Embed: nn.NewEmbedding(cfg.Vocab, cfg.Hidden, std, rng),
		Pos:   nn.NewPositionalEmbedding(cfg.Seq, cfg.Hidden, 0.01, rng),
	}
	resid := float32(1 / math.Sqrt(2*float64(len(layers))))
	for i, c := range layers {
		if c.In != cfg.Hidden {
			return nil, fmt.Errorf("moe/client: LM block %d has input size %d, want %d", i, c.In, cfg.Hidden)
		}
		if c.Search == nil || c.Search.Grid().Prefix != cfg.Grids[i].Prefix || !slices.Equal(c.Search.Grid().Size, cfg.Grids[i].Size) {
			return nil, fmt.Errorf("moe/client: LM block %d must search grid %q", i, cfg.Grids[i].Prefix)
		}
		c.Seed = cfg.Seed + uint64(i+1)*7919
		l, err := New(c)
		if err != nil {
			return nil, fmt.Errorf("moe/client: LM block %d: %w", i, err)
		}
		attn := nn.NewCausalSelfAttention(cfg.Hidden, cfg.Heads, std, rng)
		tensor.Scale(resid, attn.Wo.W.Value.Data)
		m.Blocks = append(m.Blocks, &LMBlock{LN1: nn.NewLayerNorm(cfg.Hidden, 1e-5), Attn: attn, MoE: l})
	}
	m.LN = nn.NewLayerNorm(cfg.Hidden, 1e-5)
	if cfg.Untied {
		m.Head = nn.NewLinear(cfg.Hidden, cfg.Vocab, std, rng)
	} else {
		m.Head = nn.NewTiedHead(m.Embed)
	}
	return m, nil
}

// Config returns the model's configuration.
func (m *LM) Config() LMConfig { return m.cfg }

func withPrefix(prefix string, ps []*nn.Param) []*nn.Param {
	out := make([]*nn.Param, len(ps))
	for i, p := range ps {
		out[i] = &nn.Param{Name: prefix + p.Name, Value: p.Value, Grad: p.Grad}
	}
	return out
}

// Params lists the local parameters, each once: "embed.weight",
// "pos.weight", "blockI.ln1.*", "blockI.attn.*", "blockI.moe.gate.*",
// "ln.*" and, if untied, "head.*".
func (m *LM) Params() []*nn.Param {
	ps := withPrefix("embed.", m.Embed.Params())
	ps = append(ps, withPrefix("pos.", m.Pos.Params())...)
	for i, b := range m.Blocks {
		pre := fmt.Sprintf("block%d.", i)
		ps = append(ps, withPrefix(pre+"ln1.", b.LN1.Params())...)
		ps = append(ps, withPrefix(pre+"attn.", b.Attn.Params())...)
		ps = append(ps, withPrefix(pre+"moe.", b.MoE.Params())...)
	}
	ps = append(ps, withPrefix("ln.", m.LN.Params())...)
	return append(ps, withPrefix("head.", m.Head.Params())...)
}

type lmBlockState struct {
	sl1, sa nn.State
	h       *tensor.Tensor // attention residual output, [batch, seq, hidden]
	moe     nn.State
}

// ForwardCtx runs the block on x [batch, seq, hidden].
func (b *LMBlock) ForwardCtx(ctx context.Context, x *tensor.Tensor) (*tensor.Tensor, nn.State, error) {
	if len(x.Shape) != 3 || x.Shape[2] != b.Attn.Hidden {
		return nil, nil, fmt.Errorf("moe/client: LM block input %v, want [batch, seq, %d]", x.Shape, b.Attn.Hidden)
	}
	n1, sl1 := b.LN1.Forward(nn.Ctx{}, x)
	h, sa := b.Attn.Forward(nn.Ctx{}, n1)
	tensor.Add(h.Data, h.Data, x.Data)
	bsz, seq, hid := x.Shape[0], x.Shape[1], x.Shape[2]
	y, sm, err := b.MoE.ForwardCtx(ctx, h.Reshape(bsz*seq, hid))
	if err != nil {
		return nil, nil, err
	}
	if len(y.Shape) != 2 || y.Shape[0] != bsz*seq || y.Shape[1] != hid {
		return nil, nil, fmt.Errorf("moe/client: DMoE output %v, want [%d, %d]", y.Shape, bsz*seq, hid)
	}
	for i, a := range Answered(sm) {
		if a == 0 { // no expert: the sub-block is the identity
			copy(y.Data[i*hid:(i+1)*hid], h.Data[i*hid:(i+1)*hid])
		}
	}
	return y.Reshape(bsz, seq, hid), &lmBlockState{sl1: sl1, sa: sa, h: h, moe: sm}, nil
}

// BackwardCtx returns the gradient with respect to the block's input,
// accumulating the local gradients; the DMoE layer's experts are updated
// by their servers.
func (b *LMBlock) BackwardCtx(ctx context.Context, s nn.State, dy *tensor.Tensor) (*tensor.Tensor, error) {
	st, ok := s.(*lmBlockState)
	if !ok || st == nil {
		return nil, errors.New("moe/client: LM block Backward needs the state of its Forward")
	}
	if dy.Len() != st.h.Len() {
		return nil, fmt.Errorf("moe/client: LM block gradient %v for output %v", dy.Shape, st.h.Shape)
	}
	bsz, seq, hid := st.h.Shape[0], st.h.Shape[1], st.h.Shape[2]
	dh, err := b.MoE.BackwardCtx(ctx, st.moe, dy.Reshape(bsz*seq, hid))
	if dh == nil {
		return nil, err
	}
	for i, a := range Answered(st.moe) {
		if a == 0 {
			copy(dh.Data[i*hid:(i+1)*hid], dy.Data[i*hid:(i+1)*hid])
		}
	}
	dh = dh.Reshape(bsz, seq, hid)
	dx := b.LN1.Backward(st.sl1, b.Attn.Backward(st.sa, dh))
	tensor.Add(dx.Data, dx.Data, dh.Data)
	return dx, err
}

type lmState struct {
	emb, pos, ln, head nn.State
	blocks             []nn.State
}

// checkTokens validates a batch of token ids before it reaches the
// embedding, which would panic on a bad id.
func (m *LM) checkTokens(x *tensor.Tensor) error {
	if len(x.Shape) != 2 || x.Shape[0] < 1 || x.Shape[1] < 1 || x.Shape[1] > m.cfg.Seq {
		return fmt.Errorf("moe/client: LM input %v, want [batch, seq ≤ %d]", x.Shape, m.cfg.Seq)
	}
	for _, v := range x.Data {
		if id := int(v); id < 0 || id >= m.cfg.Vocab || float32(id) != v {
			return fmt.Errorf("moe/client: LM input holds token id %v outside [0, %d)", v, m.cfg.Vocab)
		}
	}
	return nil
}

func (m *LM) forward(ctx context.Context, x *tensor.Tensor) (*tensor.Tensor, *lmState, error) {
	if err := m.checkTokens(x); err != nil {
		return nil, nil, err
	}
	st := &lmState{blocks: make([]nn.State, len(m.Blocks))}
	h, s := m.Embed.Forward(nn.Ctx{}, x)
	st.emb = s
	h, st.pos = m.Pos.Forward(nn.Ctx{}, h)
	for i, b := range m.Blocks {
		var err error
		h, s, err = b.ForwardCtx(ctx, h)
		if err != nil {
			return nil, nil, fmt.Errorf("LM block %d: %w", i, err)
		}
		st.blocks[i] = s
	}
	h, st.ln = m.LN.Forward(nn.Ctx{}, h)
	logits, s := m.Head.Forward(nn.Ctx{}, h)
	st.head = s
	return logits, st, nil
}

// Predict returns the [batch, seq, Vocab] logits of x, [batch, seq] token
// ids. It fails if a DMoE layer leaves a position without any answering
// expert (unless AllowZeroOutputs).
func (m *LM) Predict(ctx context.Context, x *tensor.Tensor) (*tensor.Tensor, error) {
	y, _, err := m.forward(ctx, x)
	return y, err
}

// Loss returns the mean next-token cross-entropy of x against targets
// (row-major, batch·seq of them) without training anything.
func (m *LM) Loss(ctx context.Context, x *tensor.Tensor, targets []int) (float32, error) {
	logits, err := m.Predict(ctx, x)
	if err != nil {
		return 0, err
	}
	if err := m.checkTargets(x, targets); err != nil {
		return 0, err
	}
	loss, _ := nn.SequenceCrossEntropy(logits, targets)
	return loss, nil
}

func (m *LM) checkTargets(x *tensor.Tensor, targets []int) error {
	if len(targets) != x.Len() {
		return fmt.Errorf("moe/client: %d targets for input %v", len(targets), x.Shape)
	}
	for _, t := range targets {
		if t < 0 || t >= m.cfg.Vocab {
			return fmt.Errorf("moe/client: target %d outside [0, %d)", t, m.cfg.Vocab)
		}
	}
	return nil
}

// Step runs forward and backward on one batch of [batch, seq] token ids x
// and their next-token targets, accumulating the local gradients (the
// caller zeroes them and steps its optimizer) while the servers update the
// experts. It returns the loss.
func (m *LM) Step(ctx context.Context, x *tensor.Tensor, targets []int) (float32, error) {
	if err := m.checkTargets(x, targets); err != nil {
		return 0, err
	}
	logits, st, err := m.forward(ctx, x)
	if err != nil {
		return 0, err
	}
	loss, dl := nn.SequenceCrossEntropy(logits, targets)
	dh := m.LN.Backward(st.ln, m.Head.Backward(st.head, dl))
	for i := len(m.Blocks) - 1; i >= 0; i-- {
		dh, err = m.Blocks[i].BackwardCtx(ctx, st.blocks[i], dh)
		if err != nil {
			return loss, fmt.Errorf("LM block %d backward: %w", i, err)
		}
	}
	m.Embed.Backward(st.emb, m.Pos.Backward(st.pos, dh))
	return loss, nil
}
