package train

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/skyhive/skyhive/checkpoint"
	"github.com/skyhive/skyhive/text"
)

// Files ExportTokens writes into its directory.
const (
	ExportTrainFile = "train.bin"
	ExportValFile   = "val.bin"
	ExportMetaFile  = "tokens.json"
)

// TokenExport describes the token files ExportTokens wrote: what
// tokens.json holds. Another trainer (python/skyhive, nanoGPT-style
// loaders) reads train.bin and val.bin as little-endian ids of TokenWidth
// bytes and gets the same tokens, split and model signature as a Skyhive
// peer of the same data and options.
type TokenExport struct {
	Format      string  `json:"format"` // "skyhive-tokens"
	Version     int     `json:"version"`
	Data        string  `json:"data"`
	Vocab       int     `json:"vocab"`
	TokenWidth  int     `json:"token_width"`
	Seed        uint64  `json:"seed"`
	ValFraction float64 `json:"val_fraction"`
	TrainTokens int     `json:"train_tokens"`
	ValTokens   int     `json:"val_tokens"`
	// Signature is LMData.Signature, which a PyTorch twin of a GPT gives
	// the daemon so that it averages with Go peers of the same data.
	Signature string `json:"data_signature"`
	// Tokenizer is the BPE tokenizer (text.Tokenizer's JSON); absent for
	// token data.
	Tokenizer json.RawMessage `json:"tokenizer,omitempty"`
}

// ExportTokens tokenizes and splits corpus as every language-model
// trainer of Skyhive does (Tokenize with o) and writes the training and
// validation tokens to dir (created if missing) as ExportTrainFile and
// ExportValFile, and their description as ExportMetaFile. Each file is
// replaced atomically.
func ExportTokens(corpus Corpus, o TokenizeOptions, dir string) (TokenExport, error) {
	d, err := Tokenize(corpus, o)
	if err != nil {
		return TokenExport{}, err
	}
	width := 2
	if d.Vocab > 1<<16 {
		width = 4
	}
	e := TokenExport{
		Format: "skyhive-tokens", Version: 1, Data: corpus.Name, Vocab: d.Vocab, TokenWidth: width,
		Seed: o.Seed, ValFraction: o.valFraction(), TrainTokens: len(d.Train), ValTokens: len(d.Val),
		Signature: d.Signature(),
	}
	if d.Tokenizer != nil {
		if e.Tokenizer, err = d.Tokenizer.MarshalJSON(); err != nil {
			return e, err
		}
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return e, fmt.Errorf("export tokens: %w", err)
	}
	if err := text.WriteTokenFile(filepath.Join(dir, ExportTrainFile), d.Train, width); err != nil {
		return e, err
	}
	if err := text.WriteTokenFile(filepath.Join(dir, ExportValFile), d.Val, width); err != nil {
		return e, err
	}
	b, err := json.Marshal(e)
	if err != nil {
		return e, err
	}
	meta := filepath.Join(dir, ExportMetaFile)
	if err := checkpoint.WriteAtomic(meta, func(w io.Writer) error { _, err := w.Write(append(b, '\n')); return err }); err != nil {
		return e, err
	}
	return e, nil
}
