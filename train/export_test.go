package train

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/skyhive/skyhive/text"
)

func TestExportTokensWritesWhatEveryTrainerTrainsOn(t *testing.T) {
	corpus := Corpus{Name: "text:book", Text: []byte(strings.Repeat("the quick brown fox jumps over the lazy dog. ", 400))}
	o := TokenizeOptions{Vocab: 300, Seed: 4}
	dir := filepath.Join(t.TempDir(), "out")
	e, err := ExportTokens(corpus, o, dir)
	if err != nil {
		t.Fatal(err)
	}
	want, err := Tokenize(corpus, o)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		file string
		want []int32
	}{{ExportTrainFile, want.Train}, {ExportValFile, want.Val}} {
		got, err := text.ReadTokenFile(filepath.Join(dir, c.file), 2, want.Vocab)
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(got, c.want) {
			t.Errorf("%s: %d tokens differ from Tokenize's %d", c.file, len(got), len(c.want))
		}
	}
	b, err := os.ReadFile(filepath.Join(dir, ExportMetaFile))
	if err != nil {
		t.Fatal(err)
	}
	var meta TokenExport
	if err := json.Unmarshal(b, &meta); err != nil {
		t.Fatal(err)
	}
	if meta.Signature != want.Signature() || !strings.HasPrefix(meta.Signature, "bpe-") || meta.Vocab != want.Vocab ||
		meta.TrainTokens != len(want.Train) || meta.ValTokens != len(want.Val) || meta.Seed != 4 || meta.TokenWidth != 2 {
		t.Errorf("tokens.json %+v does not describe the tokens (signature %s)", meta, want.Signature())
	}
	tok, err := text.ParseTokenizer(meta.Tokenizer)
	if err != nil || !slices.Equal(tok.Merges(), want.Tokenizer.Merges()) {
		t.Errorf("tokens.json's tokenizer: %v", err)
	}
	if e.Signature != meta.Signature || e.TrainTokens != meta.TrainTokens || e.ValTokens != meta.ValTokens {
		t.Errorf("ExportTokens returned %+v, wrote %+v", e, meta)
	}
}
