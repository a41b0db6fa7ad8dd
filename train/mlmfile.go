package train

import (
	"encoding/json"
	"fmt"

	"github.com/skyhive/skyhive/models"
	"github.com/skyhive/skyhive/nn"
	"github.com/skyhive/skyhive/text"
)

// Metadata keys of a masked language model's checkpoint, with the keys of
// every language-model checkpoint (lmfile.go) but metaGPT; its metaTask is
// "masked-lm". docs/checkpoint.md lists them.
const (
	metaBERT    = "skyhive.bert"    // BERT MLM configuration, JSON (bertJSON)
	metaMasking = "skyhive.masking" // the masking recipe, JSON (text.Masking)
)

// bertJSON is the BERT MLM configuration as it is stored in a checkpoint.
type bertJSON struct {
	Vocab   int     `json:"vocab"` // [MASK] included
	Seq     int     `json:"seq"`
	Hidden  int     `json:"hidden"`
	Heads   int     `json:"heads"`
	Layers  int     `json:"layers"`
	FFN     int     `json:"ffn"`
	Dropout float32 `json:"dropout"`
	MaskID  int32   `json:"mask_id"`
}

func bertJSONOf(c nn.BERTMLMConfig) bertJSON {
	return bertJSON{c.Vocab, c.Seq, c.Hidden, c.Heads, c.Layers, c.FFN, c.Dropout, c.MaskID()}
}

// MLM is a trained masked language model as a checkpoint holds it.
type MLM struct {
	Spec   string           // model spec ("bert-mlm-mini:1025x64")
	Config nn.BERTMLMConfig // the spec's configuration
	Model  *nn.Sequential
	// Tokenizer turns text into the model's token ids; nil when the model
	// was trained on token data. Its ids are below Config.MaskID().
	Tokenizer *text.Tokenizer
	// Masking is the recipe the model was trained with: its MaskID is
	// Config.MaskID() and its Vocab the data's.
	Masking text.Masking
	Data    string // the data it was trained on
	Steps   int64  // training steps done
}

// LoadMLM reads a masked-language-model checkpoint written by RunMLM: the
// model with its weights, the tokenizer and the masking recipe. The file
// must carry a valid Skyhive checksum, and hold a masked language model.
func LoadMLM(path string) (*MLM, error) {
	m, _, err := loadMLM(path)
	return m, err
}

func loadMLM(path string) (*MLM, *lmState, error) {
	f, err := readLM(path, models.MaskedLM.String())
	if err != nil {
		return nil, nil, err
	}
	m := &MLM{Spec: f.Meta[metaModel], Data: f.Meta[metaData]}
	if m.Config, err = models.ParseMLM(m.Spec); err != nil {
		return nil, nil, fmt.Errorf("checkpoint %s: %w", path, err)
	}
	c := m.Config
	var b bertJSON
	if err := json.Unmarshal([]byte(f.Meta[metaBERT]), &b); err != nil {
		return nil, nil, fmt.Errorf("checkpoint %s: bad %s metadata: %w", path, metaBERT, err)
	}
	if b != bertJSONOf(c) {
		return nil, nil, fmt.Errorf("checkpoint %s: %s %s does not match the model spec %s", path, metaBERT, f.Meta[metaBERT], m.Spec)
	}
	if err := json.Unmarshal([]byte(f.Meta[metaMasking]), &m.Masking); err != nil {
		return nil, nil, fmt.Errorf("checkpoint %s: bad %s metadata: %w", path, metaMasking, err)
	}
	if err := m.Masking.Validate(); err != nil || m.Masking.MaskID != c.MaskID() {
		return nil, nil, fmt.Errorf("checkpoint %s: %s %s is not a recipe for [MASK] %d: %v", path, metaMasking, f.Meta[metaMasking], c.MaskID(), err)
	}
	var st *lmState
	m.Tokenizer, m.Model, st, err = readLMBody(path, f, int(c.MaskID()), func(seed uint64) (*nn.Sequential, error) { return models.BuildMLM(m.Spec, seed) })
	if err != nil {
		return nil, nil, err
	}
	if m.Tokenizer != nil && m.Tokenizer.VocabSize() != m.Masking.Vocab {
		return nil, nil, fmt.Errorf("checkpoint %s: tokenizer of %d tokens but masking over %d", path, m.Tokenizer.VocabSize(), m.Masking.Vocab)
	}
	m.Steps = st.step
	return m, st, nil
}
