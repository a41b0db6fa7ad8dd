package train

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"strings"
	"time"

	"github.com/skyhive/skyhive/metrics"
	"github.com/skyhive/skyhive/models"
	"github.com/skyhive/skyhive/nn"
	"github.com/skyhive/skyhive/tensor"
	"github.com/skyhive/skyhive/text"
)

// MLMResult is the outcome of RunMLM, field for field like LMResult where
// the two agree. Perplexities are exp(mean negative log-likelihood per
// token) over the same masked validation positions.
type MLMResult struct {
	Model       string `json:"model"` // the full spec built
	Params      int64  `json:"params"`
	Data        string `json:"data"`
	CorpusBytes int    `json:"corpus_bytes,omitempty"` // of text read (text corpora)
	// Vocab is the model's vocabulary, [MASK] included: the data's + 1
	// for a spec completed from the data.
	Vocab       int `json:"vocab"`
	MaskID      int `json:"mask_id"` // the [MASK] token's id, Vocab−1
	Seq         int `json:"seq"`
	BatchSize   int `json:"batch"`
	TrainTokens int `json:"train_tokens"`
	ValTokens   int `json:"val_tokens"`
	// EvalTokens is how many validation tokens the evaluated windows hold;
	// MaskedTokens how many of them were chosen for prediction (15%) and
	// predicted, by the model and by the unigram alike.
	EvalTokens      int     `json:"eval_tokens"`
	MaskedTokens    int     `json:"masked_tokens"`
	TokenizeSeconds float64 `json:"tokenize_seconds"` // BPE training and encoding
	Steps           int64   `json:"steps"`
	TokensTrained   int64   `json:"tokens_trained"` // in the windows of every step
	// Seconds is the training time (of all runs, when resumed), without
	// tokenization and evaluation.
	Seconds         float64 `json:"seconds"`
	TokensPerSecond float64 `json:"tokens_per_second"` // of this run
	TrainLoss       float64 `json:"train_loss"`        // on masked positions, mean over the last tenth of the run
	ValLoss         float64 `json:"val_loss"`
	ValPerplexity   float64 `json:"val_perplexity"` // masked-token perplexity
	// ValAccuracy is the fraction of the masked positions whose most
	// likely token is the original.
	ValAccuracy float64 `json:"val_accuracy"`
	// UnigramPerplexity is the add-one unigram's (of the training split)
	// on the same masked positions: what a model that ignores the context
	// gets.
	UnigramPerplexity float64 `json:"unigram_perplexity"`
	// Ratio is ValPerplexity / UnigramPerplexity.
	Ratio       float64 `json:"ratio"`
	EvalSeconds float64 `json:"eval_seconds"`
	// FillMask is the fill-mask demonstration on validation sentences
	// (text corpora only).
	FillMask   []FillMask `json:"fill_mask,omitempty"`
	Resumed    bool       `json:"resumed"`
	Checkpoint string     `json:"checkpoint,omitempty"`
}

// FillMask is one sentence of the fill-mask demonstration: validation text
// with one word replaced by [MASK], the word, and the model's most likely
// token in its place.
type FillMask struct {
	Text       string `json:"text"`
	Answer     string `json:"answer"`
	Prediction string `json:"prediction"`
}

// fillMaskExamples is how many validation sentences RunMLM's fill-mask
// demonstration shows.
const fillMaskExamples = 3

// Streams of the masking generators. Each training step's batch and each
// validation window gets a generator of its own, seeded with the run's
// seed and its index: a resumed run masks as an uninterrupted one does, and
// the validation masking depends neither on the batch size nor on
// training.
const (
	trainMaskStream = 0x6d61736b2d74726e // "mask-trn"
	valMaskStream   = 0x6d61736b2d76616c // "mask-val"
)

// maskRNG is the masking generator of index i of a stream.
func maskRNG(seed, stream, i uint64) *rand.Rand {
	return rand.New(rand.NewPCG(seed, stream^(i*0x9e3779b97f4a7c15)))
}

// RunMLM trains a BERT masked language model (models.MaskedLM, e.g.
// "bert-mlm-mini") on corpus, as RunLM trains a GPT: the same tokenization
// and split, the same sampler of [BatchSize, Seq] windows, AdamW with
// warm-up and cosine decay over Steps or Duration, progress to out,
// checkpoints and resume. Each step's windows are masked with BERT's
// recipe (text.BERTMasking: 15% of the positions chosen, 80% of those
// replaced by [MASK], 10% by a random token, 10% kept), and the loss is
// the cross entropy of the original tokens at the chosen positions only.
// After training, the validation split is cut into windows of Seq tokens,
// masked once with a generator seeded by cfg.Seed and the window's index,
// and the model's masked-token perplexity and accuracy are measured next
// to the add-one unigram's perplexity on the same positions. A text
// corpus's run ends with a fill-mask demonstration on a few validation
// sentences. cfg.Prompt, SampleTokens and Temperature, which are for
// generation, are not used. When ctx is cancelled it saves a checkpoint
// (if configured) and returns ctx's error.
func RunMLM(ctx context.Context, cfg LMConfig, corpus Corpus, out io.Writer) (MLMResult, error) {
	res := MLMResult{Data: corpus.Name, BatchSize: cfg.BatchSize}
	p, err := prepareLM(cfg, corpus, maskedLM(), out)
	if err != nil {
		return res, err
	}
	cfg, run := p.cfg, p.run
	if run.tm, err = metrics.NewTraining(cfg.Metrics); err != nil {
		return res, err
	}
	defer run.tm.Close()
	mcfg, err := models.ParseMLM(run.spec)
	if err != nil {
		return res, err
	}
	masking := text.BERTMasking(mcfg.MaskID(), p.vocab)
	res.Model, res.Params, res.CorpusBytes, res.Vocab, res.MaskID, res.Seq = run.spec, p.params, p.corpusBytes, mcfg.Vocab, int(mcfg.MaskID()), run.seq
	res.TrainTokens, res.ValTokens, res.TokenizeSeconds, res.Resumed = len(p.train), len(p.val), p.tokenizeSeconds, p.resumed
	if err := p.trainAndSave(ctx, out); err != nil {
		return res, err
	}
	res.Steps, res.TrainLoss, res.TokensTrained, res.Seconds, res.TokensPerSecond = run.step, run.lastLoss, run.tokensTrained(), run.trained().Seconds(), run.tokensPerSecond()
	res.Checkpoint = cfg.Checkpoint

	t1 := time.Now()
	evalIDs := EvalCut(p.val, cfg.EvalTokens)
	ev, err := EvaluateMLM(ctx, run.model, evalIDs, run.seq, cfg.BatchSize, masking, cfg.Seed)
	if err != nil {
		return res, err
	}
	res.EvalTokens, res.MaskedTokens = ev.Windows*run.seq, len(ev.Targets)
	res.ValLoss, res.ValPerplexity, res.ValAccuracy = ev.Loss, math.Exp(ev.Loss), ev.Accuracy
	run.tm.Eval(ev.Loss, ev.Accuracy)
	res.UnigramPerplexity = unigramPerplexity(p.train, ev.Targets, p.vocab)
	res.Ratio = res.ValPerplexity / res.UnigramPerplexity
	res.EvalSeconds = time.Since(t1).Seconds()
	fmt.Fprintf(out, "validation masked-token perplexity %.2f (loss %.4f), accuracy %.1f%%, on %d masked of %d tokens; unigram %.2f; ratio to the unigram %.3f\n",
		res.ValPerplexity, res.ValLoss, 100*res.ValAccuracy, res.MaskedTokens, res.EvalTokens, res.UnigramPerplexity, res.Ratio)

	if run.tok == nil {
		fmt.Fprintln(out, "no fill-mask demonstration: token data comes without its tokenizer")
		return res, nil
	}
	if res.FillMask, err = fillMask(ctx, run.model, run.tok, p.val, run.seq, mcfg.MaskID(), fillMaskExamples); err != nil {
		return res, err
	}
	for _, f := range res.FillMask {
		fmt.Fprintf(out, "fill-mask: %s → %q (was %q)\n", f.Text, f.Prediction, f.Answer)
	}
	return res, nil
}

// maskedLM returns the kind of RunMLM: BERT on masked-token cross entropy.
func maskedLM() lmKind {
	return lmKind{
		objective: models.MaskedLM,
		wrong: func(model string, o models.Objective) error {
			if o == models.CausalLM {
				return fmt.Errorf("model %q is a causal language model: train it with RunLM (want %s, e.g. bert-mlm-mini)", model, models.MLMUsage())
			}
			return fmt.Errorf("model %q is not a masked language model (want %s, e.g. bert-mlm-mini)", model, models.MLMUsage())
		},
		spec: func(model string, vocab, seq int) (string, int, int, error) {
			spec, c, err := mlmSpec(model, vocab, seq)
			return spec, c.Vocab, c.Seq, err
		},
		build: models.BuildMLM,
		load: func(path string) (*lmCheckpoint, error) {
			m, st, err := loadMLM(path)
			if err != nil {
				return nil, err
			}
			return &lmCheckpoint{spec: m.Spec, data: m.Data, tok: m.Tokenizer, model: m.Model, state: st}, nil
		},
		setup: func(run *lmRun, vocab int) error {
			c, err := models.ParseMLM(run.spec)
			if err != nil {
				return err
			}
			masking := text.BERTMasking(c.MaskID(), vocab)
			if err := masking.Validate(); err != nil {
				return err
			}
			bj, err := json.Marshal(bertJSONOf(c))
			if err != nil {
				return err
			}
			mj, err := json.Marshal(masking)
			if err != nil {
				return err
			}
			run.task = models.MaskedLM.String()
			run.meta = map[string]string{metaBERT: string(bj), metaMasking: string(mj)}
			seed := run.cfg.Seed
			run.inputs = func(b text.Batch, step int64) (*tensor.Tensor, []int, error) {
				return masking.Apply(b.X, maskRNG(seed, trainMaskStream, uint64(step)))
			}
			run.loss = func(logits *tensor.Tensor, targets []int) (float32, *tensor.Tensor) {
				loss, d, _ := nn.MaskedSequenceCrossEntropy(logits, targets)
				return loss, d
			}
			return nil
		},
	}
}

// mlmSpec completes a masked-language-model spec for data of vocab token
// ids: a BERT size without parameters gets ":VOCABxSEQ" with VOCAB =
// vocab+1, its last id being [MASK] (seq 0: models.DefaultSeq). A spec
// with parameters must have a vocabulary of at least vocab+1 and, if seq
// is set, that context.
func mlmSpec(model string, vocab, seq int) (string, nn.BERTMLMConfig, error) {
	spec := model
	if !strings.Contains(model, ":") {
		if seq == 0 {
			seq = models.DefaultSeq
		}
		spec = fmt.Sprintf("%s:%dx%d", model, vocab+1, seq)
	}
	c, err := models.ParseMLM(spec)
	if err != nil {
		return "", nn.BERTMLMConfig{}, err
	}
	if c.Vocab < vocab+1 {
		return "", nn.BERTMLMConfig{}, fmt.Errorf("model %s has a vocabulary of %d, but the data has %d token ids and [MASK] needs one more: give the model no vocabulary (--model %s) or one of at least %d",
			spec, c.Vocab, vocab, strings.SplitN(model, ":", 2)[0], vocab+1)
	}
	if seq != 0 && c.Seq != seq {
		return "", nn.BERTMLMConfig{}, fmt.Errorf("model %s has a context of %d tokens but --seq is %d: set one of them", spec, c.Seq, seq)
	}
	return spec, c, nil
}

// MLMEval is a masked language model's score on held-out text
// (EvaluateMLM).
type MLMEval struct {
	// Loss is the mean cross entropy over the masked positions, in nats
	// per token.
	Loss float64
	// Accuracy is the fraction of the masked positions whose most likely
	// token is the original.
	Accuracy float64
	// Windows is how many windows of seq tokens were evaluated.
	Windows int
	// Targets are the original tokens of the masked positions, in order:
	// what a reference model must predict to be compared.
	Targets []int32
}

// EvaluateMLM scores a masked language model on tokens in inference mode:
// the tokens are cut into consecutive windows of seq (text.Windows), batch
// windows at a time; window i is masked with masking and a generator
// seeded with seed and i alone, so the same tokens, recipe and seed always
// give the same masked positions whatever the batch; and the model predicts
// the original token at every chosen position from the whole window.
func EvaluateMLM(ctx context.Context, model nn.Module, tokens []int32, seq, batch int, masking text.Masking, seed uint64) (MLMEval, error) {
	var ev MLMEval
	windows, err := text.Windows(tokens, batch, seq)
	if err != nil {
		return ev, err
	}
	var sum float64
	hits := 0
	for b := range windows {
		if err := ctx.Err(); err != nil {
			return ev, err
		}
		x, labels, err := maskWindows(b.X, masking, seed, ev.Windows)
		if err != nil {
			return ev, err
		}
		logits, _ := model.Forward(nn.Ctx{}, x)
		loss, _, n := nn.MaskedSequenceCrossEntropy(logits, labels)
		sum += float64(loss) * float64(n)
		v := logits.Shape[2]
		for i, l := range labels {
			if l == text.IgnoreLabel {
				continue
			}
			if argmax(logits.Data[i*v:(i+1)*v], v) == l {
				hits++
			}
			ev.Targets = append(ev.Targets, int32(l))
		}
		ev.Windows += b.X.Shape[0]
	}
	if len(ev.Targets) == 0 {
		return ev, fmt.Errorf("evaluating a masked language model: no window of %d tokens: %w", seq, text.ErrEmpty)
	}
	ev.Loss = sum / float64(len(ev.Targets))
	ev.Accuracy = float64(hits) / float64(len(ev.Targets))
	return ev, nil
}

// maskWindows masks the rows of x, windows first, first+1, … of the
// validation text, each with the generator of its index.
func maskWindows(x *tensor.Tensor, masking text.Masking, seed uint64, first int) (*tensor.Tensor, []int, error) {
	rows, seq := x.Shape[0], x.Shape[1]
	out := tensor.New(rows, seq)
	labels := make([]int, 0, rows*seq)
	for r := range rows {
		row := tensor.FromSlice(x.Data[r*seq:(r+1)*seq], 1, seq)
		mx, ml, err := masking.Apply(row, maskRNG(seed, valMaskStream, uint64(first+r)))
		if err != nil {
			return nil, nil, err
		}
		copy(out.Data[r*seq:(r+1)*seq], mx.Data)
		labels = append(labels, ml...)
	}
	return out, labels, nil
}

// argmax returns the index of the largest of the first n scores.
func argmax(scores []float32, n int) int {
	best := 0
	for j, v := range scores[:n] {
		if v > scores[best] {
			best = j
		}
	}
	return best
}

// fillMask is RunMLM's demonstration: in n windows of the validation
// tokens, evenly spread, it masks one word near the middle (a token of a
// space and at least three letters, if the window has one) and asks the
// model for its most likely token there, [MASK] and ids beyond the
// tokenizer excluded.
func fillMask(ctx context.Context, model nn.Module, tok *text.Tokenizer, val []int32, seq int, maskID int32, n int) ([]FillMask, error) {
	rows := len(val) / seq
	var out []FillMask
	for i := 0; i < n && i < rows; i++ {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		w := val[(2*i+1)*rows/(2*n)*seq:][:seq]
		pos := wordNearMiddle(tok, w)
		x := tensor.New(1, seq)
		for j, id := range w {
			x.Data[j] = float32(id)
		}
		x.Data[pos] = float32(maskID)
		logits, _ := model.Forward(nn.Ctx{}, x)
		v := logits.Shape[2]
		pred := argmax(logits.Data[pos*v:(pos+1)*v], min(tok.VocabSize(), int(maskID)))
		before, err := tok.Decode(w[:pos])
		if err != nil {
			return nil, err
		}
		after, err := tok.Decode(w[pos+1:])
		if err != nil {
			return nil, err
		}
		answer := string(tok.Piece(w[pos]))
		space := ""
		if strings.HasPrefix(answer, " ") {
			space = " "
		}
		out = append(out, FillMask{
			Text:       strings.ToValidUTF8(clipContext(string(before), true)+space+"[MASK]"+clipContext(string(after), false), "?"),
			Answer:     strings.ToValidUTF8(strings.TrimSpace(answer), "?"),
			Prediction: strings.ToValidUTF8(strings.TrimSpace(string(tok.Piece(int32(pred)))), "?"),
		})
	}
	if len(out) == 0 {
		return nil, errors.New("fill-mask: the validation text is shorter than one window")
	}
	return out, nil
}

// wordNearMiddle returns the position of the word token nearest the middle
// of w, or the middle if w has none.
func wordNearMiddle(tok *text.Tokenizer, w []int32) int {
	mid := len(w) / 2
	for d := 0; d <= mid; d++ {
		for _, p := range []int{mid + d, mid - d} {
			if p >= 0 && p < len(w) && isWord(tok.Piece(w[p])) {
				return p
			}
		}
	}
	return mid
}

// isWord reports whether a token is a space and at least three ASCII
// letters.
func isWord(piece []byte) bool {
	if len(piece) < 4 || piece[0] != ' ' {
		return false
	}
	for _, c := range piece[1:] {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z') {
			return false
		}
	}
	return true
}

// fillMaskContext is how much text the demonstration shows on each side
// of the mask, in bytes.
const fillMaskContext = 70

// clipContext keeps the demonstration's text on one side of the mask
// short: the part on the mask's line, cut at a space to about
// fillMaskContext bytes, without the word the window's edge cuts through,
// and with an ellipsis where text was left out.
func clipContext(s string, before bool) string {
	isLetter := func(c byte) bool { return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' }
	if before {
		if i := strings.LastIndexByte(s, '\n'); i >= 0 {
			return s[i+1:]
		}
		if len(s) > fillMaskContext {
			s = s[len(s)-fillMaskContext:]
		} else if s == "" || !isLetter(s[0]) {
			return s
		}
		if i := strings.IndexByte(s, ' '); i >= 0 {
			s = s[i:]
		}
		return "…" + s
	}
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		return s[:i]
	}
	if len(s) > fillMaskContext {
		s = s[:fillMaskContext]
	} else if s == "" || !isLetter(s[len(s)-1]) {
		return s
	}
	if i := strings.LastIndexByte(s, ' '); i > 0 {
		s = s[:i]
	}
	return s + "…"
}
