package nn

import (
	"fmt"
	"math/rand/v2"
)

// MLP returns a multi-layer perceptron on [batch, sizes[0]] inputs:
// Linear → ReLU → (Dropout) for every hidden size, then a final Linear to
// sizes[len-1] logits. Hidden layers use He initialisation, the output layer
// Xavier. MLP([]int{784, 512, 256, 10}, 0.1, rng) is the Fashion-MNIST model.
func MLP(sizes []int, dropout float32, rng *rand.Rand) *Sequential {
	if len(sizes) < 2 {
		panic("nn: MLP needs at least an input and an output size")
	}
	s := NewSequential()
	for i := 0; i+2 < len(sizes); i++ {
		s.Append("fc", NewLinear(sizes[i], sizes[i+1], HeStd(sizes[i]), rng))
		s.Append("relu", ReLU{})
		if dropout > 0 {
			s.Append("drop", NewDropout(dropout, rng))
		}
	}
	n := len(sizes)
	s.Append("out", NewLinear(sizes[n-2], sizes[n-1], XavierStd(sizes[n-2], sizes[n-1]), rng))
	return s
}

// BERTConfig describes a BERT encoder stack.
type BERTConfig struct {
	Vocab   int     // token vocabulary (token-input models only)
	Seq     int     // maximum sequence length
	Hidden  int     // hidden size
	Heads   int     // attention heads; Hidden must be divisible by Heads
	Layers  int     // encoder layers
	FFN     int     // inner size of the feed-forward block (4·Hidden in BERT)
	Dropout float32 // dropout probability in training
	Classes int     // classifier outputs (classifier models only)
}

// BERTLarge is BERT-large's encoder geometry (24 layers of hidden 1024,
// 16 heads, FFN 4096) at sequence length 128 with the WordPiece vocabulary.
func BERTLarge() BERTConfig {
	return BERTConfig{Vocab: 30522, Seq: 128, Hidden: 1024, Heads: 16, Layers: 24, FFN: 4096, Dropout: 0.1, Classes: 2}
}

// BERTBase is BERT-base's geometry (12 layers of hidden 768, 12 heads) at
// sequence length 128.
func BERTBase() BERTConfig {
	return BERTConfig{Vocab: 30522, Seq: 128, Hidden: 768, Heads: 12, Layers: 12, FFN: 3072, Dropout: 0.1, Classes: 2}
}

// Validate reports a configuration that cannot be built.
func (c BERTConfig) Validate() error {
	return validateTransformer("BERT", c, c.Seq > 0, c.Hidden, c.Heads, c.Layers, c.FFN, c.Dropout)
}

// validateTransformer checks the geometry shared by the transformer
// configurations (cfg, of kind, is printed whole when a size is wrong;
// sizesOK carries the checks of the sizes the kinds do not share).
func validateTransformer(kind string, cfg any, sizesOK bool, hidden, heads, layers, ffn int, dropout float32) error {
	switch {
	case !sizesOK || hidden <= 0 || heads <= 0 || layers < 0 || ffn <= 0:
		return fmt.Errorf("nn: %s config %+v: sizes must be positive", kind, cfg)
	case hidden%heads != 0:
		return fmt.Errorf("nn: %s config: hidden %d not divisible by %d heads", kind, hidden, heads)
	case dropout < 0 || dropout >= 1:
		return fmt.Errorf("nn: %s config: dropout %v outside [0, 1)", kind, dropout)
	}
	return nil
}

// appendEncoders adds cfg.Layers encoder layers named "enc".
func appendEncoders(s *Sequential, cfg BERTConfig, rng *rand.Rand) {
	for i := 0; i < cfg.Layers; i++ {
		s.Append("enc", NewEncoderLayer(cfg.Hidden, cfg.Heads, cfg.FFN, cfg.Dropout, rng))
	}
}

// BERTEncoder returns cfg.Layers encoder layers on [batch, seq, hidden]
// inputs, one child per layer so the stack can be sliced into pipeline
// stages.
func BERTEncoder(cfg BERTConfig, rng *rand.Rand) (*Sequential, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	s := NewSequential()
	appendEncoders(s, cfg, rng)
	return s, nil
}

// BERTClassifier returns a token-input BERT on [batch, seq] float32 token
// ids: Embedding ("embed") → positional embedding ("pos") → LayerNorm
// ("ln") → Dropout → cfg.Layers encoder layers ("enc") → mask-aware mean
// pooling → Linear classifier ("head") giving [batch, Classes] logits.
// Weights are drawn from N(0, 0.02²) as in BERT.
func BERTClassifier(cfg BERTConfig, rng *rand.Rand) (*Sequential, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.Vocab <= 0 || cfg.Classes <= 0 {
		return nil, fmt.Errorf("nn: BERT classifier needs Vocab and Classes, got %d and %d", cfg.Vocab, cfg.Classes)
	}
	const std = 0.02
	s := NewSequential().
		Append("embed", NewEmbedding(cfg.Vocab, cfg.Hidden, std, rng)).
		Append("pos", NewPositionalEmbedding(cfg.Seq, cfg.Hidden, std, rng)).
		Append("ln", NewLayerNorm(cfg.Hidden, 1e-12)).
		Append("drop", NewDropout(cfg.Dropout, rng))
	appendEncoders(s, cfg, rng)
	s.Append("pool", MeanPool{}).Append("head", NewLinear(cfg.Hidden, cfg.Classes, std, rng))
	return s, nil
}

// ImageBERTConfig describes a small vision transformer for square grey
// images such as Fashion-MNIST.
type ImageBERTConfig struct {
	Size    int // image side in pixels (28)
	Patch   int // patch side in pixels; Size must be divisible by it
	Classes int
	BERTConfig
}

// ImageBERTTiny is a "bert-tiny"-style classifier for 28×28 images: 7×7
// patches (16 tokens), hidden 64, 4 heads, 2 layers, FFN 128. With AdamW
// (lr 2e-3) it reaches about 85% Fashion-MNIST test accuracy after 3 epochs
// (about 20 s per epoch on 2 cores). Patch 4 gives 49 tokens, at about 3×
// the cost.
func ImageBERTTiny() ImageBERTConfig {
	return ImageBERTConfig{Size: 28, Patch: 7, Classes: 10,
		BERTConfig: BERTConfig{Seq: 16, Hidden: 64, Heads: 4, Layers: 2, FFN: 128, Dropout: 0.1}}
}

// ImageBERT returns a BERT-style image classifier on [batch, Size·Size]
// inputs: Patchify → Linear patch embedding ("patch") → learned positional
// embedding ("pos") → LayerNorm ("ln") → Dropout → encoder layers ("enc") →
// mean pooling → Linear classifier ("head"). cfg.Seq is set from the patch
// grid.
func ImageBERT(cfg ImageBERTConfig, rng *rand.Rand) (*Sequential, error) {
	if cfg.Patch <= 0 || cfg.Size <= 0 || cfg.Size%cfg.Patch != 0 || cfg.Classes <= 0 {
		return nil, fmt.Errorf("nn: image BERT: bad size %d, patch %d or classes %d", cfg.Size, cfg.Patch, cfg.Classes)
	}
	g := cfg.Size / cfg.Patch
	cfg.Seq = g * g
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	const std = 0.02
	pix := cfg.Patch * cfg.Patch
	s := NewSequential().
		Append("patchify", Patchify{Size: cfg.Size, Patch: cfg.Patch}).
		Append("patch", NewLinear(pix, cfg.Hidden, XavierStd(pix, cfg.Hidden), rng)).
		Append("pos", NewPositionalEmbedding(cfg.Seq, cfg.Hidden, std, rng)).
		Append("ln", NewLayerNorm(cfg.Hidden, 1e-12)).
		Append("drop", NewDropout(cfg.Dropout, rng))
	appendEncoders(s, cfg.BERTConfig, rng)
	s.Append("pool", MeanPool{}).Append("head", NewLinear(cfg.Hidden, cfg.Classes, XavierStd(cfg.Hidden, cfg.Classes), rng))
	return s, nil
}
