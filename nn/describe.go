package nn

import (
	"fmt"
	"slices"
)

// LayerInfo describes one child of a Sequential well enough to rebuild its
// computation from the parameter tensors alone, without this package: a
// checkpoint stores the list (Describe) as JSON, and docs/checkpoint.md
// gives each Type's formula and parameter names. Parameters are named
// Name + "." + the suffixes that docs/checkpoint.md lists per type (for
// example "0.fc.weight", shape [In, Out], applied as x·W + b).
type LayerInfo struct {
	// Name is the child's parameter prefix: its index and name, "0.fc".
	Name string `json:"name"`
	// Type is one of linear, relu, gelu, dropout, layernorm, embedding,
	// positional_embedding, patchify, reshape, mean_pool, attention, ffn,
	// encoder (post-LN BERT layer), decoder (pre-LN GPT block), expert
	// (pre-LN FFN block), tied_head and head.
	Type string `json:"type"`
	// In and Out are a linear layer's sizes.
	In  int `json:"in,omitempty"`
	Out int `json:"out,omitempty"`
	// Hidden is the width of normalisation, embedding and transformer
	// layers; Heads, FFN and Causal describe attention and feed-forward
	// blocks (Activation is the FFN's: "gelu" or "relu").
	Hidden     int    `json:"hidden,omitempty"`
	Heads      int    `json:"heads,omitempty"`
	FFN        int    `json:"ffn,omitempty"`
	Activation string `json:"activation,omitempty"`
	Causal     bool   `json:"causal,omitempty"`
	// Eps is a LayerNorm's epsilon (every LayerNorm of a block shares it).
	Eps float64 `json:"eps,omitempty"`
	// P is a dropout probability (identity at inference).
	P float64 `json:"p,omitempty"`
	// Vocab and MaxSeq size embedding tables.
	Vocab  int `json:"vocab,omitempty"`
	MaxSeq int `json:"max_seq,omitempty"`
	// Size and Patch describe Patchify; Shape a Reshape's per-example shape.
	Size  int   `json:"size,omitempty"`
	Patch int   `json:"patch,omitempty"`
	Shape []int `json:"shape,omitempty"`
	// Table names the embedding table a tied head multiplies by
	// ("0.embed.weight").
	Table string `json:"table,omitempty"`
}

// Describe lists s's children for readers without this package. It fails
// for a module type it cannot describe, so that a checkpoint never claims
// a description it does not have.
func Describe(s *Sequential) ([]LayerInfo, error) {
	out := make([]LayerInfo, 0, s.Len())
	for i, l := range s.layers {
		info, err := describe(l.Module)
		if err != nil {
			return nil, fmt.Errorf("nn: describe layer %d (%s): %w", i, l.Name, err)
		}
		info.Name = s.prefix(i)
		if info.Type == "tied_head" {
			info.Table, err = s.tableName(l.Module.(*TiedHead))
			if err != nil {
				return nil, err
			}
		}
		out = append(out, info)
	}
	return out, nil
}

// tableName finds the parameter name of the table a tied head borrows.
func (s *Sequential) tableName(h *TiedHead) (string, error) {
	for _, p := range s.Params() {
		if p.Value == h.Table.Value {
			return p.Name, nil
		}
	}
	return "", fmt.Errorf("nn: describe: tied head's table is not a parameter of the model")
}

func describe(m Module) (LayerInfo, error) {
	switch m := m.(type) {
	case *Linear:
		return LayerInfo{Type: "linear", In: m.In, Out: m.Out}, nil
	case ReLU:
		return LayerInfo{Type: "relu"}, nil
	case GELU:
		return LayerInfo{Type: "gelu"}, nil
	case *Dropout:
		return LayerInfo{Type: "dropout", P: float64(m.P)}, nil
	case *LayerNorm:
		return LayerInfo{Type: "layernorm", Hidden: m.Dim, Eps: float64(m.Eps)}, nil
	case *Embedding:
		return LayerInfo{Type: "embedding", Vocab: m.Vocab, Hidden: m.Hidden}, nil
	case *PositionalEmbedding:
		return LayerInfo{Type: "positional_embedding", MaxSeq: m.MaxSeq, Hidden: m.Hidden}, nil
	case Patchify:
		return LayerInfo{Type: "patchify", Size: m.Size, Patch: m.Patch}, nil
	case Reshape:
		return LayerInfo{Type: "reshape", Shape: slices.Clone(m.Shape)}, nil
	case MeanPool:
		return LayerInfo{Type: "mean_pool"}, nil
	case *MultiHeadAttention:
		return LayerInfo{Type: "attention", Hidden: m.Hidden, Heads: m.Heads, Causal: m.Causal}, nil
	case *FFN:
		act, err := activationName(m.Act)
		return LayerInfo{Type: "ffn", Hidden: m.FC1.In, FFN: m.FC1.Out, Activation: act}, err
	case *EncoderLayer:
		act, err := activationName(m.FFN.Act)
		return LayerInfo{Type: "encoder", Hidden: m.Attn.Hidden, Heads: m.Attn.Heads, FFN: m.FFN.FC1.Out,
			Activation: act, Causal: m.Attn.Causal, Eps: float64(m.LN1.Eps), P: float64(m.Drop1.P)}, err
	case *DecoderLayer:
		act, err := activationName(m.FFN.Act)
		return LayerInfo{Type: "decoder", Hidden: m.Attn.Hidden, Heads: m.Attn.Heads, FFN: m.FFN.FC1.Out,
			Activation: act, Causal: m.Attn.Causal, Eps: float64(m.LN1.Eps), P: float64(m.Drop1.P)}, err
	case *Expert:
		act, err := activationName(m.FFN.Act)
		return LayerInfo{Type: "expert", Hidden: m.FFN.FC1.In, FFN: m.FFN.FC1.Out, Activation: act, Eps: float64(m.LN.Eps)}, err
	case *TiedHead:
		return LayerInfo{Type: "tied_head", Vocab: m.Vocab, Hidden: m.Hidden}, nil
	case *Head:
		return LayerInfo{Type: "head", Vocab: m.Vocab, Hidden: m.Hidden}, nil
	}
	return LayerInfo{}, fmt.Errorf("no description for %T", m)
}

func activationName(m Module) (string, error) {
	switch m.(type) {
	case GELU:
		return "gelu", nil
	case ReLU:
		return "relu", nil
	}
	return "", fmt.Errorf("no description for activation %T", m)
}
