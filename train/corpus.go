package train

import (
	"errors"
	"fmt"
	"strings"

	"github.com/skyhive/skyhive/models"
	"github.com/skyhive/skyhive/text"
)

// Corpus is the data a language model trains on: raw text, which RunLM
// tokenizes with a byte-level BPE it trains on the text itself, or token
// ids that are already tokenized.
type Corpus struct {
	// Name says where the data came from ("gcide", "text:PATH",
	// "tokens:PATH"), for reports and checkpoints.
	Name string
	// Text is the raw text; nil when Tokens is set.
	Text []byte
	// Tokens are pre-tokenized ids, each below Vocab; nil when Text is set.
	Tokens []int32
	// Vocab is the vocabulary size of Tokens (0 for Text).
	Vocab int
}

// TextDataUsage lists the --data values LoadCorpus takes.
const TextDataUsage = "gcide, gcide:PATH, text:PATH or tokens:PATH"

// IsTextData reports whether spec names text data (one of TextDataUsage)
// rather than an image data set, without reading anything.
func IsTextData(spec string) bool {
	kind, _, _ := strings.Cut(spec, ":")
	switch kind {
	case "gcide", "text", "tokens":
		return true
	}
	return false
}

// IsLanguageModel reports whether the model spec names a language model of
// the registry ("gpt-mini", "gpt-mini:4096x128", "gpt:6x256:8000"), with or
// without its parameters. Specs that name no model give false; building
// them reports the error.
func IsLanguageModel(spec string) bool {
	name, _, _ := strings.Cut(spec, ":")
	for _, m := range models.List() {
		if m.Name == name {
			return m.Task == models.LanguageModeling
		}
	}
	return false
}

// LoadCorpus reads the text data that spec names:
//
//   - "gcide": the GCIDE dictionary at text.DefaultGCIDEPath, as prose;
//   - "gcide:PATH": a GCIDE dictd database elsewhere;
//   - "text:PATH": a plain text file, its bytes as they are;
//   - "tokens:PATH": a nanoGPT-style token file of width-byte ids (2 or 4),
//     every id below vocab.
//
// maxBytes bounds what is read (of the decompressed dictionary, of the text
// file, or of the token file; text.DefaultMaxBytes when <= 0). The errors
// say what to do about a missing, empty or malformed corpus.
func LoadCorpus(spec string, maxBytes int64, width, vocab int) (Corpus, error) {
	kind, path, hasPath := strings.Cut(spec, ":")
	if (kind == "text" || kind == "tokens") && path == "" || kind == "gcide" && hasPath && path == "" {
		return Corpus{}, fmt.Errorf("data %q needs a file: %s:PATH", spec, kind)
	}
	switch kind {
	case "gcide":
		raw, err := text.LoadGCIDE(path, maxBytes)
		if errors.Is(err, text.ErrEmpty) {
			err = fmt.Errorf("%w (read more of it with a larger --corpus-bytes)", err)
		}
		return Corpus{Name: spec, Text: raw}, err
	case "text":
		raw, err := text.ReadTextFile(path, maxBytes)
		if errors.Is(err, text.ErrEmpty) {
			err = fmt.Errorf("%w (give a file with text in it)", err)
		}
		return Corpus{Name: spec, Text: raw}, err
	case "tokens":
		if vocab <= 0 {
			return Corpus{}, fmt.Errorf("data %s: give the vocabulary size of the token file with --vocab (50257 for GPT-2's tokenizer)", spec)
		}
		ids, err := text.ReadTokenFile(path, width, vocab)
		switch {
		case errors.Is(err, text.ErrEmpty):
			return Corpus{}, fmt.Errorf("%w (the file holds no tokens)", err)
		case errors.Is(err, text.ErrFormat):
			return Corpus{}, fmt.Errorf("%w: --vocab must be the vocabulary of the tokenizer that wrote the file, above every id in it, and --token-width its id size (2 for uint16, 4 for uint32)", err)
		case err != nil:
			return Corpus{}, err
		}
		if maxBytes > 0 && int64(len(ids))*int64(width) > maxBytes {
			ids = ids[:maxBytes/int64(width)]
		}
		return Corpus{Name: spec, Tokens: ids, Vocab: vocab}, nil
	}
	return Corpus{}, fmt.Errorf("unknown text data %q (want %s)", spec, TextDataUsage)
}
