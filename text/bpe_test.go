package text

import (
	"bytes"
	"errors"
	"math/rand/v2"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
)

func randomBytes(n int, seed uint64) []byte {
	rng := rand.New(rand.NewPCG(seed, 1))
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(rng.UintN(256))
	}
	return b
}

const english = `It was the best of times, it was the worst of times, it was the age of
wisdom, it was the age of foolishness, it was the epoch of belief, it was the
epoch of incredulity, it was the season of Light, it was the season of
Darkness, it was the spring of hope, it was the winter of despair.
`

func TestTrainBPEHandWorked(t *testing.T) {
	// Chunks "ab", " ab", " ab", " cd": (a,b) occurs 3 times, then
	// (" ", ab) twice; nothing else occurs twice.
	tok, err := TrainBPE([]byte("ab ab ab cd"), 300)
	if err != nil {
		t.Fatal(err)
	}
	want := []Pair{{'a', 'b'}, {' ', 256}}
	if got := tok.Merges(); !slices.Equal(got, want) {
		t.Fatalf("merges %v, want %v", got, want)
	}
	if tok.VocabSize() != 258 || string(tok.Piece(257)) != " ab" {
		t.Errorf("vocab %d, piece 257 %q", tok.VocabSize(), tok.Piece(257))
	}
	if got := tok.Encode([]byte("ab ab cd")); !slices.Equal(got, []int32{256, 257, ' ', 'c', 'd'}) {
		t.Errorf("Encode = %v", got)
	}
}

func TestTrainBPETieBreak(t *testing.T) {
	// Chunks "ba", " ba", " ab", " ab". (" ",a), (a,b) and (b,a) all occur
	// twice: the smallest left id wins, so (" ",a) first; then (b,a) beats
	// (" a",b) on the left id; then (" a",b).
	tok, err := TrainBPE([]byte("ba ba ab ab"), 1000)
	if err != nil {
		t.Fatal(err)
	}
	want := []Pair{{' ', 'a'}, {'b', 'a'}, {256, 'b'}}
	if got := tok.Merges(); !slices.Equal(got, want) {
		t.Fatalf("merges %v, want %v", got, want)
	}
}

func TestBPERoundTripRandomBytes(t *testing.T) {
	tok, err := TrainBPE(append(randomBytes(20000, 1), english...), 600)
	if err != nil {
		t.Fatal(err)
	}
	for seed := range uint64(20) {
		b := randomBytes(int(seed)*97, seed+100)
		got, err := tok.Decode(tok.Encode(b))
		if err != nil || !bytes.Equal(got, b) {
			t.Fatalf("seed %d: round trip of %d random bytes failed (err %v)", seed, len(b), err)
		}
	}
}

func TestBPEChunksBounded(t *testing.T) {
	// A long run of one byte is a single class: chunks cap it, so no token
	// grows past MaxPieceBytes.
	text := bytes.Repeat([]byte("="), 5000)
	tok, err := TrainBPE(text, 1000)
	if err != nil {
		t.Fatal(err)
	}
	for id := range int32(tok.VocabSize()) {
		if n := len(tok.Piece(id)); n > MaxPieceBytes {
			t.Fatalf("token %d has %d bytes", id, n)
		}
	}
	if got, err := tok.Decode(tok.Encode(text)); err != nil || !bytes.Equal(got, text) {
		t.Fatal("round trip of the run failed")
	}
}

// TestEncodeMatchesTraining checks that encoding the training text applies
// the merges exactly as training did: it yields as many tokens as the
// trainer's words hold symbols.
func TestEncodeMatchesTraining(t *testing.T) {
	text := []byte(strings.Repeat(english, 3) + "aaaa aaa aaaaa 1234 12 ,,,,..")
	tr := newTrainer(text)
	var merges []Pair
	for len(merges) < 200 {
		p, ok := tr.best()
		if !ok {
			break
		}
		tr.merge(p, int32(256+len(merges)))
		merges = append(merges, p)
	}
	tok, err := newTokenizer(merges)
	if err != nil {
		t.Fatal(err)
	}
	var want int64
	for _, w := range tr.words {
		want += w.count * int64(len(w.syms))
	}
	if got := len(tok.Encode(text)); int64(got) != want {
		t.Errorf("Encode gave %d tokens, training ended with %d symbols", got, want)
	}
	// The incremental counts equal a recount from scratch.
	recount := map[Pair]int64{}
	for _, w := range tr.words {
		for k := 0; k+1 < len(w.syms); k++ {
			recount[Pair{w.syms[k], w.syms[k+1]}] += w.count
		}
	}
	for p, c := range recount {
		if tr.counts[p] != c {
			t.Errorf("pair %v: incremental count %d, recount %d", p, tr.counts[p], c)
		}
	}
	for p, c := range tr.counts {
		if recount[p] != c {
			t.Errorf("pair %v: stale count %d", p, c)
		}
	}
}

func TestTrainBPEDeterministic(t *testing.T) {
	text := []byte(strings.Repeat(english, 5))
	a, err := TrainBPE(text, 400)
	if err != nil {
		t.Fatal(err)
	}
	b, err := TrainBPE(bytes.Clone(text), 400)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(a.Merges(), b.Merges()) {
		t.Fatal("two trainings on the same text learned different merges")
	}
}

func TestTrainBPEErrors(t *testing.T) {
	if _, err := TrainBPE(nil, 512); !errors.Is(err, ErrEmpty) {
		t.Errorf("empty text: err = %v, want ErrEmpty", err)
	}
	for _, v := range []int{0, 255, MaxBPEVocab + 1} {
		if _, err := TrainBPE([]byte("abc"), v); err == nil {
			t.Errorf("vocabulary size %d accepted", v)
		}
	}
}

func TestBPEGCIDE(t *testing.T) {
	text := loadRealGCIDE(t, 3<<20)
	tok, err := TrainBPE(text, 2048)
	if err != nil {
		t.Fatal(err)
	}
	if tok.VocabSize() != 2048 {
		t.Fatalf("vocabulary %d, want 2048", tok.VocabSize())
	}
	ids := tok.Encode(text)
	got, err := tok.Decode(ids)
	if err != nil || !bytes.Equal(got, text) {
		t.Fatalf("round trip of %d bytes of GCIDE failed (err %v)", len(text), err)
	}
	// English compresses: well under half a token per byte at 2048 tokens.
	if r := float64(len(ids)) / float64(len(text)); r > 0.4 {
		t.Errorf("%.3f tokens per byte, want < 0.4", r)
	}
	again, err := TrainBPE(text, 2048)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(tok.Merges(), again.Merges()) {
		t.Error("training twice on GCIDE learned different merges")
	}
	t.Logf("%d bytes -> %d tokens (%.3f tokens/byte)", len(text), len(ids), float64(len(ids))/float64(len(text)))
}

func TestTokenizerSaveLoad(t *testing.T) {
	tok, err := TrainBPE([]byte(strings.Repeat(english, 4)), 350)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "tok.json")
	if err := tok.Save(path); err != nil {
		t.Fatal(err)
	}
	got, err := LoadTokenizer(path)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(got.Merges(), tok.Merges()) {
		t.Fatal("loaded merges differ")
	}
	if !slices.Equal(got.Encode([]byte(english)), tok.Encode([]byte(english))) {
		t.Fatal("loaded tokenizer encodes differently")
	}
	// Embedding into other JSON (checkpoint metadata) and back.
	b, err := tok.MarshalJSON()
	if err != nil {
		t.Fatal(err)
	}
	var back Tokenizer
	if err := back.UnmarshalJSON(b); err != nil || !slices.Equal(back.Merges(), tok.Merges()) {
		t.Fatalf("UnmarshalJSON: %v", err)
	}
}

func TestParseTokenizerRejects(t *testing.T) {
	for name, in := range map[string]string{
		"not json":       `merges`,
		"wrong format":   `{"format":"gpt2","version":1,"vocab_size":256,"merges":[]}`,
		"wrong version":  `{"format":"skyhive-bpe","version":2,"vocab_size":256,"merges":[]}`,
		"vocab mismatch": `{"format":"skyhive-bpe","version":1,"vocab_size":300,"merges":[[1,2]]}`,
		"forward id":     `{"format":"skyhive-bpe","version":1,"vocab_size":257,"merges":[[1,256]]}`,
		"negative id":    `{"format":"skyhive-bpe","version":1,"vocab_size":257,"merges":[[-1,2]]}`,
		"repeat":         `{"format":"skyhive-bpe","version":1,"vocab_size":258,"merges":[[1,2],[1,2]]}`,
		"three ids":      `{"format":"skyhive-bpe","version":1,"vocab_size":257,"merges":[[1,2,3]]}`,
		"unknown field":  `{"format":"skyhive-bpe","version":1,"vocab_size":256,"merges":[],"x":1}`,
		"trailing":       `{"format":"skyhive-bpe","version":1,"vocab_size":256,"merges":[]} {}`,
		"huge id":        `{"format":"skyhive-bpe","version":1,"vocab_size":257,"merges":[[1,4294967296]]}`,
		"too long":       longPieceTokenizer(),
	} {
		if _, err := ParseTokenizer([]byte(in)); !errors.Is(err, ErrFormat) {
			t.Errorf("%s: err = %v, want ErrFormat", name, err)
		}
	}
}

// longPieceTokenizer doubles a token until it exceeds MaxPieceBytes.
func longPieceTokenizer() string {
	var b strings.Builder
	b.WriteString(`{"format":"skyhive-bpe","version":1,"vocab_size":265,"merges":[[97,97]`)
	for i := range 8 {
		b.WriteString(",[" + strconv.Itoa(256+i) + "," + strconv.Itoa(256+i) + "]")
	}
	b.WriteString("]}")
	return b.String()
}

func TestDecodeRejectsUnknownIDs(t *testing.T) {
	tok, err := TrainBPE([]byte("ab ab ab"), 300)
	if err != nil {
		t.Fatal(err)
	}
	for _, ids := range [][]int32{{1, int32(tok.VocabSize())}, {-1}} {
		if _, err := tok.Decode(ids); err == nil {
			t.Errorf("Decode(%v) accepted ids outside a vocabulary of %d", ids, tok.VocabSize())
		}
	}
}

func FuzzParseTokenizer(f *testing.F) {
	tok, err := TrainBPE([]byte(english), 300)
	if err != nil {
		f.Fatal(err)
	}
	good, err := tok.MarshalJSON()
	if err != nil {
		f.Fatal(err)
	}
	f.Add(good)
	f.Add([]byte(`{"format":"skyhive-bpe","version":1,"vocab_size":257,"merges":[[1,2]]}`))
	f.Add([]byte(`{"format":"skyhive-bpe","version":1,"vocab_size":256,"merges":null}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		tok, err := ParseTokenizer(b)
		if err != nil {
			return
		}
		again, err := tok.MarshalJSON()
		if err != nil {
			t.Fatal(err)
		}
		back, err := ParseTokenizer(again)
		if err != nil || !slices.Equal(back.Merges(), tok.Merges()) {
			t.Fatalf("re-parsing %s failed: %v", again, err)
		}
		text := []byte("the quick brown fox \x00\xff\n")
		if got, err := tok.Decode(tok.Encode(text)); err != nil || !bytes.Equal(got, text) {
			t.Fatalf("round trip with a parsed tokenizer failed: %v", err)
		}
	})
}

func FuzzTokenizer(f *testing.F) {
	tok, err := TrainBPE([]byte(strings.Repeat(english, 3)), 400)
	if err != nil {
		f.Fatal(err)
	}
	f.Add([]byte("It was the age of wisdom"), []byte{1, 2, 3, 4})
	f.Add([]byte{0, 0xff, ' ', ' ', '\n'}, []byte{0xff, 0xff, 0xff, 0x7f})
	f.Fuzz(func(t *testing.T, text, raw []byte) {
		if got, err := tok.Decode(tok.Encode(text)); err != nil || !bytes.Equal(got, text) {
			t.Fatalf("round trip of %q gave %q, %v", text, got, err)
		}
		ids := make([]int32, len(raw)/2)
		valid := true
		for i := range ids {
			ids[i] = int32(int16(uint16(raw[2*i]) | uint16(raw[2*i+1])<<8))
			valid = valid && ids[i] >= 0 && int(ids[i]) < tok.VocabSize()
		}
		out, err := tok.Decode(ids)
		if (err == nil) != valid {
			t.Fatalf("Decode(%v): err %v, ids valid %v", ids, err, valid)
		}
		if err != nil {
			return
		}
		if again, err := tok.Decode(tok.Encode(out)); err != nil || !bytes.Equal(again, out) {
			t.Fatalf("re-encoding the decoded %q gave %q, %v", out, again, err)
		}
	})
}
