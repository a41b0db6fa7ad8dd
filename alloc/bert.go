package alloc

import (
	"fmt"
	"strconv"
	"strings"
)

// Transformer describes a BERT-style encoder layer and its batch.
type Transformer struct {
	// Hidden, Heads, Seq and FFN are H, A, S and F.
	Hidden, Heads, Seq, FFN int
	// Batch is B, the samples per iteration.
	Batch int
}

// BertLarge returns BERT-large's encoder geometry (H=1024, A=16, S=128,
// F=4096) for a batch.
func BertLarge(batch int) Transformer {
	return Transformer{Hidden: 1024, Heads: 16, Seq: 128, FFN: 4096, Batch: batch}
}

// BertBase returns BERT-base's geometry (H=768, A=12, S=128, F=3072).
func BertBase(batch int) Transformer {
	return Transformer{Hidden: 768, Heads: 12, Seq: 128, FFN: 3072, Batch: batch}
}

// Layer computes one encoder layer's costs analytically (fp32, 4 bytes).
//
// Forward FLOPs (a multiply-add counts 2), with T = B·S tokens:
//
//	QKV and output projections  4 · 2·T·H²
//	scores QKᵀ and context      2 · 2·B·S²·H
//	FFN (two matmuls)           2 · 2·T·H·F
//	softmax and scaling         6·B·A·S²
//	GELU                        8·T·F
//	two LayerNorms              2 · 8·T·H
//	biases and residual adds    T·(4H + F + H) + 2·T·H
//
// Backward FLOPs = 2 × forward (gradients for inputs and weights).
//
// Parameters: attention 4H²+4H, FFN 2HF+F+H, LayerNorms 4H floats
// (12H²+13H for F=4H).
//
// Activation memory kept for backward, in floats: the attention input,
// Q, K and V (4·T·H), the softmax output (B·A·S²), the context and the
// attention-output LayerNorm input (2·T·H), the FFN input (T·H), the FFN
// pre-GELU and post-GELU activations (2·T·F), and the output LayerNorm
// input (T·H): 8·T·H + 2·T·F + B·A·S² floats; plus one-byte dropout masks
// for the attention probabilities and the two hidden dropouts
// (B·A·S² + 2·T·H bytes).
//
// Output activation sent to the next stage: T·H floats.
func (t Transformer) Layer(name string) Layer {
	B, S, H, A, F := float64(t.Batch), float64(t.Seq), float64(t.Hidden), float64(t.Heads), float64(t.FFN)
	T := B * S
	fwd := 4*2*T*H*H + 2*2*B*S*S*H + 2*2*T*H*F +
		6*B*A*S*S + 8*T*F + 2*8*T*H + T*(4*H+F+H) + 2*T*H
	params := 4*H*H + 4*H + 2*H*F + F + H + 4*H
	actFloats := 8*T*H + 2*T*F + B*A*S*S
	actMask := B*A*S*S + 2*T*H
	return Layer{
		Name:            name,
		FwdFLOPs:        fwd,
		BwdFLOPs:        2 * fwd,
		ParamBytes:      int64(4 * params),
		ActivationBytes: int64(4*actFloats + actMask),
		OutputBytes:     int64(4 * T * H),
	}
}

// Model returns n identical encoder layers named prefix-i.
func (t Transformer) Model(name string, n int) *Model {
	m := &Model{Name: name, Batch: t.Batch, MicroBatches: 1}
	for i := 0; i < n; i++ {
		m.Layers = append(m.Layers, t.Layer(fmt.Sprintf("encoder-%d", i)))
	}
	return m
}

// DefaultBatch is the batch of generated models when none is given.
const DefaultBatch = 32

// GenerateModel builds a model from a generator spec "NAME:LAYERS" with
// NAME bert-large or bert-base, e.g. "bert-large:160" (160 encoder
// layers). batch ≤ 0 selects DefaultBatch; micro is the micro-batch count
// (≤ 1: sequential).
func GenerateModel(spec string, batch, micro int) (*Model, error) {
	name, count, ok := strings.Cut(spec, ":")
	if !ok {
		return nil, fmt.Errorf("alloc: model spec %q: want NAME:LAYERS, e.g. bert-large:160", spec)
	}
	n, err := strconv.Atoi(count)
	if err != nil || n <= 0 {
		return nil, fmt.Errorf("alloc: model spec %q: bad layer count", spec)
	}
	if batch <= 0 {
		batch = DefaultBatch
	}
	var t Transformer
	switch name {
	case "bert-large":
		t = BertLarge(batch)
	case "bert-base":
		t = BertBase(batch)
	default:
		return nil, fmt.Errorf("alloc: model spec %q: unknown generator %q (known: bert-large, bert-base)", spec, name)
	}
	m := t.Model(spec, n)
	m.MicroBatches = max(micro, 1)
	return m, nil
}
