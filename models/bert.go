package models

import (
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"

	"github.com/skyhive/skyhive/nn"
)

// Bounds of "bert-stack" specs, so that a peer cannot make a worker build
// an absurd model: every worker builds the whole model before keeping its
// layers, and BERT-large's 24 layers of hidden 1024 have 302M parameters.
const (
	maxBERTLayers = 256
	minBERTHidden = 8
	maxBERTHidden = 2048
	maxBERTParams = 400e6
	// bertHeadDim is the head size of "bert-stack" specs, as in BERT.
	bertHeadDim = 64
	// bertPatch is the side of the patches the stack embeds: 7×7 patches
	// of a 28×28 image give 16 tokens.
	bertPatch = 7
)

// bertStackHelp is the registry's description of "bert-stack".
var bertStackHelp = fmt.Sprintf("BERT encoder stack on 7×7 patches (16 tokens): LAYERS encoder layers of HIDDEN units, HIDDEN/%d heads (at least 1), FFN 4·HIDDEN, dropout 0.1, as a pipeline of LAYERS+7 layers; 1..%d layers, hidden %d..%d, at most %.0fM parameters",
	bertHeadDim, maxBERTLayers, minBERTHidden, maxBERTHidden, maxBERTParams/1e6)

// BERTStackConfig returns the image-BERT configuration of a "bert-stack"
// spec's parameters ("LAYERSxHIDDEN", the text after the ':'): LAYERS
// encoder layers of HIDDEN units with HIDDEN/64 heads (at least one; 16
// at 1024, as in BERT-large) and an FFN of 4·HIDDEN, on the 16 7×7 patches
// of a 28×28 image. It refuses geometries out of bounds, hidden sizes the
// heads do not divide, and models over 400M parameters.
func BERTStackConfig(params string) (nn.ImageBERTConfig, error) {
	ls, hs, ok := strings.Cut(params, "x")
	layers, err1 := strconv.Atoi(ls)
	hidden, err2 := strconv.Atoi(hs)
	if !ok || err1 != nil || err2 != nil || layers < 1 || layers > maxBERTLayers || hidden < minBERTHidden || hidden > maxBERTHidden {
		return nn.ImageBERTConfig{}, fmt.Errorf("bert-stack needs LAYERSxHIDDEN with 1..%d layers and hidden %d..%d", maxBERTLayers, minBERTHidden, maxBERTHidden)
	}
	heads := max(1, hidden/bertHeadDim)
	if hidden%heads != 0 {
		return nn.ImageBERTConfig{}, fmt.Errorf("bert-stack: hidden %d is not divisible by its %d heads (use a multiple of %d)", hidden, heads, bertHeadDim)
	}
	cfg := nn.ImageBERTConfig{Size: 28, Patch: bertPatch, Classes: Classes,
		BERTConfig: nn.BERTConfig{Seq: (28 / bertPatch) * (28 / bertPatch), Hidden: hidden, Heads: heads, Layers: layers, FFN: 4 * hidden, Dropout: 0.1}}
	if n := bertStackParams(cfg); n > maxBERTParams {
		return nn.ImageBERTConfig{}, fmt.Errorf("bert-stack of %.0fM parameters, at most %.0fM", n/1e6, maxBERTParams/1e6)
	}
	if err := cfg.Validate(); err != nil {
		return nn.ImageBERTConfig{}, err
	}
	return cfg, nil
}

// bertStackParams counts the parameters nn.ImageBERT builds for cfg: the
// patch embedding, the positional embedding, the embedding LayerNorm, the
// encoder layers (attention 4H²+4H, FFN 2HF+F+H, two LayerNorms 4H) and
// the classifier head.
func bertStackParams(cfg nn.ImageBERTConfig) float64 {
	h, f, pix := float64(cfg.Hidden), float64(cfg.FFN), float64(cfg.Patch*cfg.Patch)
	layer := 4*h*h + 4*h + 2*h*f + f + h + 4*h
	return pix*h + h + float64(cfg.Seq)*h + 2*h + float64(cfg.Layers)*layer + h*float64(cfg.Classes) + float64(cfg.Classes)
}

// buildBERTStack parses "LAYERSxHIDDEN" and builds the image BERT.
func buildBERTStack(params string, rng *rand.Rand) (*nn.Sequential, error) {
	cfg, err := BERTStackConfig(params)
	if err != nil {
		return nil, err
	}
	m, err := nn.ImageBERT(cfg, rng)
	if err != nil {
		return nil, fmt.Errorf("bert-stack: %w", err)
	}
	return m, nil
}
