package text

import (
	"bytes"
	"container/heap"
	"encoding/json"
	"fmt"
	"io"
	"os"
)

// Byte-level BPE limits.
const (
	// MaxBPEVocab is the largest vocabulary TrainBPE builds and a tokenizer
	// file may describe; ids then fit uint16 token files.
	MaxBPEVocab = 1 << 16
	// MaxPieceBytes bounds the bytes one token stands for. Text is cut
	// into chunks of at most this many bytes before merging, so no trained
	// token is longer, and a tokenizer file with a longer one is rejected.
	MaxPieceBytes = 256
	// MaxTokenizerBytes bounds a tokenizer's JSON encoding.
	MaxTokenizerBytes = 4 << 20
)

// tokenizerFormat and tokenizerVersion identify the JSON encoding.
const (
	tokenizerFormat  = "skyhive-bpe"
	tokenizerVersion = 1
)

// encodeCacheEntries bounds the per-call cache of encoded chunks.
const encodeCacheEntries = 1 << 16

// Pair is two adjacent token ids that a merge joins into a new token.
type Pair struct{ Left, Right int32 }

// Tokenizer is a byte-level BPE tokenizer. Ids 0..255 are the single bytes;
// id 256+i is the i-th merge, the concatenation of its pair's bytes. Any
// byte string encodes, and decoding gives it back exactly.
//
// Text is first cut into chunks, which merges never cross: a run of
// letters (ASCII letters and all bytes >= 0x80, so UTF-8 stays whole), of
// digits, or of other non-space bytes, each with at most one leading space;
// and runs of whitespace, whose last space goes with the following word.
// Chunks are at most MaxPieceBytes long.
//
// A Tokenizer is immutable and safe for concurrent use.
type Tokenizer struct {
	merges []Pair
	ranks  map[Pair]int32 // pair -> merge index
	pieces [][]byte       // bytes of every id
}

// TrainBPE learns a tokenizer with (at most) vocabSize tokens from text.
// Merges are chosen greedily: each step joins the most frequent adjacent
// pair within chunks (counting every chunk occurrence), ties going to the
// pair with the smaller left id, then the smaller right id, so the result
// depends only on text and vocabSize. Training stops early when no pair
// occurs twice. Pair counts are updated incrementally, touching only the
// chunks that contain the merged pair, so a few MB train in seconds.
func TrainBPE(text []byte, vocabSize int) (*Tokenizer, error) {
	if vocabSize < 256 || vocabSize > MaxBPEVocab {
		return nil, fmt.Errorf("text: BPE vocabulary size %d outside [256, %d]", vocabSize, MaxBPEVocab)
	}
	if len(text) == 0 {
		return nil, fmt.Errorf("text: training BPE: %w", ErrEmpty)
	}
	tr := newTrainer(text)
	var merges []Pair
	for len(merges) < vocabSize-256 {
		p, ok := tr.best()
		if !ok {
			break
		}
		tr.merge(p, int32(256+len(merges)))
		merges = append(merges, p)
	}
	return newTokenizer(merges)
}

// word is one distinct chunk during training: its current symbols and how
// often it occurs.
type word struct {
	syms  []int32
	count int64
}

// trainer holds the incremental state of BPE training.
type trainer struct {
	words  []word
	counts map[Pair]int64   // occurrences of each adjacent pair
	where  map[Pair][]int32 // words that contain (or once contained) a pair
	heap   pairHeap         // candidate pairs; entries go stale lazily
	mark   []int32          // per word: the last merge step that visited it
	step   int32
	before map[Pair]int64 // counts at the start of the current merge
}

func newTrainer(text []byte) *trainer {
	tr := &trainer{counts: map[Pair]int64{}, where: map[Pair][]int32{}, before: map[Pair]int64{}}
	index := map[string]int32{}
	for i := 0; i < len(text); {
		j := nextChunk(text, i)
		if w, ok := index[string(text[i:j])]; ok {
			tr.words[w].count++
		} else {
			syms := make([]int32, j-i)
			for k, b := range text[i:j] {
				syms[k] = int32(b)
			}
			index[string(text[i:j])] = int32(len(tr.words))
			tr.words = append(tr.words, word{syms: syms, count: 1})
		}
		i = j
	}
	tr.mark = make([]int32, len(tr.words))
	for wi, w := range tr.words {
		for k := 0; k+1 < len(w.syms); k++ {
			p := Pair{w.syms[k], w.syms[k+1]}
			tr.counts[p] += w.count
			if l := tr.where[p]; len(l) == 0 || l[len(l)-1] != int32(wi) {
				tr.where[p] = append(l, int32(wi))
			}
		}
	}
	for p, c := range tr.counts {
		tr.heap = append(tr.heap, pairCount{p, c})
	}
	heap.Init(&tr.heap)
	return tr
}

// best pops the most frequent pair, or reports false if none occurs twice.
func (tr *trainer) best() (Pair, bool) {
	for tr.heap.Len() > 0 {
		e := heap.Pop(&tr.heap).(pairCount)
		if tr.counts[e.pair] != e.count {
			continue // stale
		}
		return e.pair, e.count >= 2
	}
	return Pair{}, false
}

// merge replaces every occurrence of p by id and updates the pair counts of
// the words that contained p.
func (tr *trainer) merge(p Pair, id int32) {
	tr.step++
	clear(tr.before)
	add := func(q Pair, n int64) {
		if _, ok := tr.before[q]; !ok {
			tr.before[q] = tr.counts[q]
		}
		tr.counts[q] += n
	}
	for _, wi := range tr.where[p] {
		if tr.mark[wi] == tr.step {
			continue
		}
		tr.mark[wi] = tr.step
		w := &tr.words[wi]
		if !hasPair(w.syms, p) {
			continue
		}
		for k := 0; k+1 < len(w.syms); k++ {
			add(Pair{w.syms[k], w.syms[k+1]}, -w.count)
		}
		w.syms = mergePair(w.syms, p, id)
		for k := 0; k+1 < len(w.syms); k++ {
			q := Pair{w.syms[k], w.syms[k+1]}
			add(q, w.count)
			// Pairs without the new id were in the word before, so only
			// new pairs need the word in their list.
			if q.Left == id || q.Right == id {
				if l := tr.where[q]; len(l) == 0 || l[len(l)-1] != wi {
					tr.where[q] = append(l, wi)
				}
			}
		}
	}
	delete(tr.where, p)
	for q, old := range tr.before {
		c := tr.counts[q]
		if c <= 0 {
			delete(tr.counts, q)
			continue
		}
		if c != old {
			heap.Push(&tr.heap, pairCount{q, c})
		}
	}
}

// hasPair reports whether p occurs in syms.
func hasPair(syms []int32, p Pair) bool {
	for k := 0; k+1 < len(syms); k++ {
		if syms[k] == p.Left && syms[k+1] == p.Right {
			return true
		}
	}
	return false
}

// mergePair replaces the occurrences of p in syms, left to right, by id, in
// place, and returns the shortened slice.
func mergePair(syms []int32, p Pair, id int32) []int32 {
	out := syms[:0]
	for k := 0; k < len(syms); k++ {
		if k+1 < len(syms) && syms[k] == p.Left && syms[k+1] == p.Right {
			out = append(out, id)
			k++
			continue
		}
		out = append(out, syms[k])
	}
	return out
}

// pairCount is a heap entry: a pair and its count when it was pushed.
type pairCount struct {
	pair  Pair
	count int64
}

// pairHeap orders pairs by count, descending, then by ids, ascending.
type pairHeap []pairCount

func (h pairHeap) Len() int { return len(h) }
func (h pairHeap) Less(i, j int) bool {
	a, b := h[i], h[j]
	if a.count != b.count {
		return a.count > b.count
	}
	if a.pair.Left != b.pair.Left {
		return a.pair.Left < b.pair.Left
	}
	return a.pair.Right < b.pair.Right
}
func (h pairHeap) Swap(i, j int) { h[i], h[j] = h[j], h[i] }
func (h *pairHeap) Push(x any)   { *h = append(*h, x.(pairCount)) }
func (h *pairHeap) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}

// Byte classes for chunking.
const (
	classSpace = iota
	classLetter
	classDigit
	classOther
)

func byteClass(b byte) int {
	switch {
	case b == ' ' || b == '\t' || b == '\n' || b == '\r' || b == '\v' || b == '\f':
		return classSpace
	case isLetter(b) || b >= 0x80:
		return classLetter
	case isDigit(b):
		return classDigit
	}
	return classOther
}

// nextChunk returns the end of the chunk of text that starts at i.
func nextChunk(text []byte, i int) int {
	n := len(text)
	c, j := byteClass(text[i]), i
	if text[i] == ' ' && i+1 < n && byteClass(text[i+1]) != classSpace {
		c, j = byteClass(text[i+1]), i+1
	}
	for j < n && byteClass(text[j]) == c {
		j++
	}
	if c == classSpace && j < n && j-1 > i && text[j-1] == ' ' {
		j-- // leave the last space to the word that follows
	}
	return min(j, i+MaxPieceBytes)
}

// newTokenizer validates merges and builds the lookup tables.
func newTokenizer(merges []Pair) (*Tokenizer, error) {
	if len(merges) > MaxBPEVocab-256 {
		return nil, fmt.Errorf("%w: %d merges exceed the limit of %d", ErrFormat, len(merges), MaxBPEVocab-256)
	}
	t := &Tokenizer{
		merges: append([]Pair(nil), merges...),
		ranks:  make(map[Pair]int32, len(merges)),
		pieces: make([][]byte, 256, 256+len(merges)),
	}
	for b := range 256 {
		t.pieces[b] = []byte{byte(b)}
	}
	for i, p := range merges {
		id := int32(256 + i)
		if p.Left < 0 || p.Left >= id || p.Right < 0 || p.Right >= id {
			return nil, fmt.Errorf("%w: merge %d (%d, %d) uses an id that is not defined before it", ErrFormat, i, p.Left, p.Right)
		}
		if prev, ok := t.ranks[p]; ok {
			return nil, fmt.Errorf("%w: merge %d repeats merge %d (%d, %d)", ErrFormat, i, prev, p.Left, p.Right)
		}
		l, r := t.pieces[p.Left], t.pieces[p.Right]
		if len(l)+len(r) > MaxPieceBytes {
			return nil, fmt.Errorf("%w: merge %d makes a token of %d bytes, more than %d", ErrFormat, i, len(l)+len(r), MaxPieceBytes)
		}
		t.ranks[p] = int32(i)
		t.pieces = append(t.pieces, append(append(make([]byte, 0, len(l)+len(r)), l...), r...))
	}
	return t, nil
}

// VocabSize returns the number of tokens: 256 plus the number of merges.
func (t *Tokenizer) VocabSize() int { return len(t.pieces) }

// Merges returns a copy of the merges in the order they were learned.
func (t *Tokenizer) Merges() []Pair { return append([]Pair(nil), t.merges...) }

// Piece returns a copy of the bytes token id stands for, or nil if id is
// outside the vocabulary.
func (t *Tokenizer) Piece(id int32) []byte {
	if id < 0 || int(id) >= len(t.pieces) {
		return nil
	}
	return bytes.Clone(t.pieces[id])
}

// Encode returns the token ids of text.
func (t *Tokenizer) Encode(text []byte) []int32 {
	out := make([]int32, 0, len(text)/3+1)
	cache := map[string][]int32{}
	for i := 0; i < len(text); {
		j := nextChunk(text, i)
		ids, ok := cache[string(text[i:j])]
		if !ok {
			ids = t.encodeChunk(text[i:j])
			if len(cache) < encodeCacheEntries {
				cache[string(text[i:j])] = ids
			}
		}
		out = append(out, ids...)
		i = j
	}
	return out
}

// encodeChunk applies the merges to one chunk in the order they were
// learned, which reproduces what training did to it.
func (t *Tokenizer) encodeChunk(chunk []byte) []int32 {
	syms := make([]int32, len(chunk))
	for k, b := range chunk {
		syms[k] = int32(b)
	}
	for len(syms) > 1 {
		bestRank := int32(-1)
		for k := 0; k+1 < len(syms); k++ {
			if r, ok := t.ranks[Pair{syms[k], syms[k+1]}]; ok && (bestRank < 0 || r < bestRank) {
				bestRank = r
			}
		}
		if bestRank < 0 {
			break
		}
		syms = mergePair(syms, t.merges[bestRank], 256+bestRank)
	}
	return syms
}

// Decode returns the bytes of ids. An id outside the vocabulary is an error
// naming its position.
func (t *Tokenizer) Decode(ids []int32) ([]byte, error) {
	n := 0
	for i, id := range ids {
		if id < 0 || int(id) >= len(t.pieces) {
			return nil, fmt.Errorf("text: token id %d at position %d is outside the vocabulary of %d", id, i, len(t.pieces))
		}
		n += len(t.pieces[id])
	}
	out := make([]byte, 0, n)
	for _, id := range ids {
		out = append(out, t.pieces[id]...)
	}
	return out, nil
}

// tokenizerJSON is the JSON encoding of a Tokenizer.
type tokenizerJSON struct {
	Format    string    `json:"format"`
	Version   int       `json:"version"`
	VocabSize int       `json:"vocab_size"`
	Merges    [][]int32 `json:"merges"`
}

// MarshalJSON encodes the tokenizer as
// {"format":"skyhive-bpe","version":1,"vocab_size":N,"merges":[[l,r],...]},
// small enough to store in checkpoint metadata.
func (t *Tokenizer) MarshalJSON() ([]byte, error) {
	j := tokenizerJSON{Format: tokenizerFormat, Version: tokenizerVersion, VocabSize: t.VocabSize(), Merges: make([][]int32, len(t.merges))}
	for i, p := range t.merges {
		j.Merges[i] = []int32{p.Left, p.Right}
	}
	return json.Marshal(j)
}

// UnmarshalJSON decodes and validates what MarshalJSON produced (see
// ParseTokenizer).
func (t *Tokenizer) UnmarshalJSON(b []byte) error {
	parsed, err := ParseTokenizer(b)
	if err != nil {
		return err
	}
	*t = *parsed
	return nil
}

// ParseTokenizer decodes a tokenizer's JSON encoding. It rejects input
// larger than MaxTokenizerBytes, unknown fields, another format or version,
// trailing data, a vocab_size that disagrees with the merges, and merges
// that refer to ids not defined before them, repeat, or make a token longer
// than MaxPieceBytes.
func ParseTokenizer(b []byte) (*Tokenizer, error) {
	t, err := parseTokenizer(b)
	if err != nil {
		return nil, fmt.Errorf("text: tokenizer: %w", err)
	}
	return t, nil
}

// parseTokenizer is ParseTokenizer without the package prefix on errors.
func parseTokenizer(b []byte) (*Tokenizer, error) {
	if len(b) > MaxTokenizerBytes {
		return nil, fmt.Errorf("%w: %d bytes exceed the limit of %d", ErrFormat, len(b), MaxTokenizerBytes)
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	var j tokenizerJSON
	if err := dec.Decode(&j); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrFormat, err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, fmt.Errorf("%w: data after the JSON object", ErrFormat)
	}
	if j.Format != tokenizerFormat || j.Version != tokenizerVersion {
		return nil, fmt.Errorf("%w: format %q version %d, want %q version %d", ErrFormat, j.Format, j.Version, tokenizerFormat, tokenizerVersion)
	}
	if j.VocabSize != 256+len(j.Merges) {
		return nil, fmt.Errorf("%w: vocab_size %d but %d merges (want 256 + merges)", ErrFormat, j.VocabSize, len(j.Merges))
	}
	merges := make([]Pair, len(j.Merges))
	for i, m := range j.Merges {
		if len(m) != 2 {
			return nil, fmt.Errorf("%w: merge %d has %d ids, want 2", ErrFormat, i, len(m))
		}
		merges[i] = Pair{m[0], m[1]}
	}
	return newTokenizer(merges)
}

// Save writes the tokenizer's JSON encoding to path, atomically.
func (t *Tokenizer) Save(path string) error {
	b, err := t.MarshalJSON()
	if err != nil {
		return fmt.Errorf("text: %w", err)
	}
	return writeFileAtomic(path, b)
}

// LoadTokenizer reads a tokenizer that Save wrote, reading at most
// MaxTokenizerBytes, and validates it (see ParseTokenizer).
func LoadTokenizer(path string) (*Tokenizer, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("text: %w", err)
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, MaxTokenizerBytes+1))
	if err != nil {
		return nil, fmt.Errorf("text: reading tokenizer %s: %w", path, err)
	}
	t, err := parseTokenizer(b)
	if err != nil {
		return nil, fmt.Errorf("text: tokenizer %s: %w", path, err)
	}
	return t, nil
}
