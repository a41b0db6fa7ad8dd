package train

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"math"
	"math/rand/v2"
	"strconv"
	"strings"
	"time"

	"github.com/skyhive/skyhive/checkpoint"
	"github.com/skyhive/skyhive/models"
	"github.com/skyhive/skyhive/nn"
	"github.com/skyhive/skyhive/optim"
	"github.com/skyhive/skyhive/tensor"
	"github.com/skyhive/skyhive/text"
)

// Metadata keys of a language-model checkpoint, besides metaModel (the
// full spec, "gpt-mini:1024x128"), metaSeed and metaStep (the optimizer's
// step); docs/checkpoint.md lists them. A masked language model's have
// metaBERT and metaMasking (mlmfile.go) instead of metaGPT.
const (
	metaTask      = "skyhive.task"      // "language modeling", or "masked-lm"
	metaGPT       = "skyhive.gpt"       // GPT configuration, JSON (gptJSON)
	metaTokenizer = "skyhive.tokenizer" // BPE tokenizer, JSON (text.Tokenizer); absent for token data
	metaData      = "skyhive.data"      // the data it trained on ("gcide", "text:PATH")
	metaLMStep    = "skyhive.step"      // training steps done
	metaSeconds   = "skyhive.train_seconds"
)

// gptJSON is the GPT configuration as it is stored in a checkpoint.
type gptJSON struct {
	Vocab   int     `json:"vocab"`
	Seq     int     `json:"seq"`
	Hidden  int     `json:"hidden"`
	Heads   int     `json:"heads"`
	Layers  int     `json:"layers"`
	FFN     int     `json:"ffn"`
	Dropout float32 `json:"dropout"`
}

// LM is a trained language model as a checkpoint holds it.
type LM struct {
	Spec   string       // model spec ("gpt-mini:1024x128")
	Config nn.GPTConfig // the spec's configuration
	Model  *nn.Sequential
	// Tokenizer turns text into the model's token ids; nil when the model
	// was trained on token data.
	Tokenizer *text.Tokenizer
	Data      string // the data it was trained on
	Steps     int64  // training steps done
}

// lmState is the training position a checkpoint holds beyond the model.
type lmState struct {
	optim   optim.State
	step    int64
	seconds float64
}

// save writes the run's checkpoint.
func (r *lmRun) save() error {
	tensors := map[string]*tensor.Tensor{}
	for name, t := range nn.ExportParams(r.model.Params()) {
		tensors["model/"+name] = t
	}
	st := r.opt.State()
	for name, t := range st.Tensors {
		tensors["optim/"+name] = t
	}
	meta := map[string]string{
		metaModel:   r.spec,
		metaData:    r.data,
		metaSeed:    strconv.FormatUint(r.cfg.Seed, 10),
		metaLMStep:  strconv.FormatInt(r.step, 10),
		metaStep:    strconv.FormatInt(st.Step, 10),
		metaSeconds: strconv.FormatFloat(r.trained().Seconds(), 'f', 3, 64),
	}
	maps.Copy(meta, r.meta)
	if err := describeMeta(meta, r.model, r.task, nil); err != nil {
		return err
	}
	if r.tok != nil {
		tj, err := r.tok.MarshalJSON()
		if err != nil {
			return err
		}
		meta[metaTokenizer] = string(tj)
	}
	if err := checkpoint.Save(r.cfg.Checkpoint, tensors, meta); err != nil {
		return fmt.Errorf("save checkpoint: %w", err)
	}
	return nil
}

// LoadLM reads a language-model checkpoint written by RunLM: the model
// with its weights, and the tokenizer. The file must carry a valid Skyhive
// checksum.
func LoadLM(path string) (*LM, error) {
	lm, _, err := loadLM(path)
	return lm, err
}

func loadLM(path string) (*LM, *lmState, error) {
	f, err := readLM(path, models.LanguageModeling.String())
	if err != nil {
		return nil, nil, err
	}
	lm := &LM{Spec: f.Meta[metaModel], Data: f.Meta[metaData]}
	if lm.Config, err = models.ParseGPT(lm.Spec); err != nil {
		return nil, nil, fmt.Errorf("checkpoint %s: %w", path, err)
	}
	var g gptJSON
	if err := json.Unmarshal([]byte(f.Meta[metaGPT]), &g); err != nil {
		return nil, nil, fmt.Errorf("checkpoint %s: bad %s metadata: %w", path, metaGPT, err)
	}
	c := lm.Config
	if (g != gptJSON{c.Vocab, c.Seq, c.Hidden, c.Heads, c.Layers, c.FFN, c.Dropout}) {
		return nil, nil, fmt.Errorf("checkpoint %s: %s %s does not match the model spec %s", path, metaGPT, f.Meta[metaGPT], lm.Spec)
	}
	var st *lmState
	lm.Tokenizer, lm.Model, st, err = readLMBody(path, f, c.Vocab, func(seed uint64) (*nn.Sequential, error) { return models.BuildLM(lm.Spec, seed) })
	if err != nil {
		return nil, nil, err
	}
	lm.Steps = st.step
	return lm, st, nil
}

// readLM loads a language-model checkpoint, refusing a file without a
// valid Skyhive checksum or of another task than task (a causal
// language model's "language modeling", a masked one's "masked-lm").
func readLM(path, task string) (*checkpoint.File, error) {
	f, err := checkpoint.Load(path)
	if err != nil {
		return nil, err
	}
	if !f.Verified {
		return nil, fmt.Errorf("checkpoint %s has no valid skyhive checksum; refusing to load it", path)
	}
	if got := f.Meta[metaTask]; got != task {
		return nil, fmt.Errorf("checkpoint %s holds %s (model %q), not %s: give another --checkpoint", path, taskName(got), f.Meta[metaModel], taskName(task))
	}
	return f, nil
}

// taskName says what a checkpoint's skyhive.task holds.
func taskName(task string) string {
	switch task {
	case models.LanguageModeling.String():
		return "a causal language model"
	case models.MaskedLM.String():
		return "a masked language model"
	case models.ImageClassification.String():
		return "an image classifier"
	}
	return fmt.Sprintf("no language model (task %q)", task)
}

// readLMBody reads what every language-model checkpoint holds besides its
// model configuration: the tokenizer, which may have at most maxTokens
// tokens, the training position, and the weights, put into the model that
// build makes from the recorded seed.
func readLMBody(path string, f *checkpoint.File, maxTokens int, build func(seed uint64) (*nn.Sequential, error)) (*text.Tokenizer, *nn.Sequential, *lmState, error) {
	var tok *text.Tokenizer
	if tj, ok := f.Meta[metaTokenizer]; ok {
		var err error
		if tok, err = text.ParseTokenizer([]byte(tj)); err != nil {
			return nil, nil, nil, fmt.Errorf("checkpoint %s: %w", path, err)
		}
		if tok.VocabSize() > maxTokens {
			return nil, nil, nil, fmt.Errorf("checkpoint %s: tokenizer of %d tokens for a model of %d", path, tok.VocabSize(), maxTokens)
		}
	}
	st := &lmState{}
	step, err := strconv.ParseInt(f.Meta[metaLMStep], 10, 64)
	if err == nil {
		if st.optim.Step, err = strconv.ParseInt(f.Meta[metaStep], 10, 64); err == nil {
			st.seconds, err = strconv.ParseFloat(f.Meta[metaSeconds], 64)
		}
	}
	if err != nil || step < 0 || st.optim.Step < 0 || !(st.seconds >= 0) || math.IsInf(st.seconds, 0) {
		return nil, nil, nil, fmt.Errorf("checkpoint %s: bad position metadata: %v", path, err)
	}
	st.step = step
	seed, err := strconv.ParseUint(f.Meta[metaSeed], 10, 64)
	if err != nil {
		return nil, nil, nil, fmt.Errorf("checkpoint %s: bad %s metadata: %w", path, metaSeed, err)
	}
	// The seed only matters to dropout, whose draws restart.
	model, err := build(seed)
	if err != nil {
		return nil, nil, nil, err
	}
	weights := map[string]*tensor.Tensor{}
	st.optim.Tensors = map[string]*tensor.Tensor{}
	for name, t := range f.Tensors {
		if n, ok := strings.CutPrefix(name, "model/"); ok {
			weights[n] = t
		} else if n, ok := strings.CutPrefix(name, "optim/"); ok {
			st.optim.Tensors[n] = t
		}
	}
	if err := nn.ImportParams(model.Params(), weights); err != nil {
		return nil, nil, nil, fmt.Errorf("checkpoint %s: %w", path, err)
	}
	return tok, model, st, nil
}

// restore puts the checkpoint's optimizer state and training position
// into run, whose model holds the checkpoint's weights.
func (s *lmState) restore(run *lmRun) error {
	if err := run.opt.LoadState(s.optim); err != nil {
		return err
	}
	run.step = s.step
	run.before = time.Duration(s.seconds * float64(time.Second))
	return nil
}

// Generate continues prompt (token ids, at least one) with n tokens of
// model, whose configuration is cfg: each token is drawn from the softmax
// of the last position's logits divided by temperature, with a generator
// seeded with seed, or is the most likely one when temperature is 0. The
// context is the last cfg.Seq tokens. It returns the new tokens.
func Generate(ctx context.Context, model nn.Module, cfg nn.GPTConfig, prompt []int32, n int, temperature float64, seed uint64) ([]int32, error) {
	if len(prompt) == 0 {
		return nil, fmt.Errorf("generate: the prompt has no tokens")
	}
	for i, id := range prompt {
		if id < 0 || int(id) >= cfg.Vocab {
			return nil, fmt.Errorf("generate: prompt token %d at position %d is outside the vocabulary of %d", id, i, cfg.Vocab)
		}
	}
	rng := rand.New(rand.NewPCG(seed, 0x5a3e))
	seq := append([]int32(nil), prompt...)
	probs := make([]float64, cfg.Vocab)
	for range n {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		window := seq[max(0, len(seq)-cfg.Seq):]
		x := tensor.New(1, len(window))
		for i, id := range window {
			x.Data[i] = float32(id)
		}
		logits, _ := model.Forward(nn.Ctx{}, x)
		last := logits.Data[(len(window)-1)*cfg.Vocab : len(window)*cfg.Vocab]
		best := 0
		for j, v := range last {
			if v > last[best] {
				best = j
			}
		}
		next := best
		if temperature > 0 {
			var sum float64
			for j, v := range last {
				probs[j] = math.Exp(float64(v-last[best]) / temperature)
				sum += probs[j]
			}
			u := rng.Float64() * sum
			for j, p := range probs {
				if u -= p; u < 0 {
					next = j
					break
				}
			}
		}
		seq = append(seq, int32(next))
	}
	return seq[len(prompt):], nil
}
