package train

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/skyhive/skyhive/metrics"
	"github.com/skyhive/skyhive/models"
	"github.com/skyhive/skyhive/nn"
	"github.com/skyhive/skyhive/optim"
	"github.com/skyhive/skyhive/tensor"
	"github.com/skyhive/skyhive/text"
)

// LMConfig configures a language-model training run (RunLM, or RunMLM for
// a masked language model).
type LMConfig struct {
	// Model is a language-model spec of package models. A GPT size without
	// parameters ("gpt-mini") gets the tokenizer's vocabulary and Seq; a
	// BERT size ("bert-mlm-mini") the vocabulary + 1, for [MASK].
	Model string
	// Vocab is the BPE vocabulary size trained on a text corpus (at least
	// 256); a token corpus brings its own (Corpus.Vocab).
	Vocab int
	// Seq is the context length of a spec without one (models.DefaultSeq
	// when 0); a spec with one ("gpt-mini:1024x64") sets it.
	Seq         int
	BatchSize   int     // sequences per step
	LR          float64 // peak learning rate (AdamW)
	WeightDecay float64 // AdamW decoupled weight decay
	Warmup      int64   // linear warm-up steps
	ClipNorm    float64 // global gradient-norm clip; 0 disables
	Seed        uint64  // seeds the initialisation, the split, the batches, the masks and the sample
	// Steps stops training after this many steps in total; Duration after
	// this much training time in total (a resumed run counts the time
	// before it). At least one must be set; the learning rate decays along
	// a cosine from the end of warm-up to the first limit reached.
	Steps    int64
	Duration time.Duration
	// ValFraction of the tokens is held out for validation (text.Split;
	// 0.1 when 0).
	ValFraction float64
	// EvalTokens bounds the validation tokens evaluated (0: all).
	EvalTokens int
	// Prompt starts the generated sample; SampleTokens is its length in
	// tokens (0: no sample), drawn with Temperature (0: greedy). RunMLM,
	// which does not generate, does not use them.
	Prompt       string
	SampleTokens int
	Temperature  float64
	// Checkpoint, if set, is written atomically every tenth of the run, at
	// the end and when the run is interrupted; Resume continues from it
	// if the file exists.
	Checkpoint string
	Resume     bool
	// Stats, if set, receives a JSON line (LMStats) every tenth of the run.
	Stats io.Writer `json:"-"`
	// Metrics, if set, receives the skyhive_train_* metrics (steps,
	// sequences, loss, the final validation loss) while the run runs.
	// Nil: no metrics.
	Metrics prometheus.Registerer `json:"-"`
}

// minLRFraction is where the cosine schedule ends, as a fraction of the
// peak learning rate.
const minLRFraction = 0.1

// Validate reports the first invalid field.
func (c LMConfig) Validate() error {
	switch {
	case c.BatchSize <= 0:
		return fmt.Errorf("batch size must be positive, got %d", c.BatchSize)
	case c.Seq < 0:
		return fmt.Errorf("sequence length must be positive, got %d", c.Seq)
	case !(c.LR > 0) || math.IsInf(c.LR, 0):
		return fmt.Errorf("learning rate must be positive, got %v", c.LR)
	case c.WeightDecay < 0 || c.ClipNorm < 0 || c.Warmup < 0:
		return errors.New("weight decay, clip norm and warm-up must not be negative")
	case c.Steps < 0 || c.Duration < 0:
		return errors.New("steps and duration must not be negative")
	case c.Steps == 0 && c.Duration == 0:
		return errors.New("a language model trains for a duration or a number of steps: give one")
	case !(c.ValFraction >= 0 && c.ValFraction < 1):
		return fmt.Errorf("validation fraction %v outside [0, 1)", c.ValFraction)
	case c.EvalTokens < 0 || c.SampleTokens < 0 || c.Vocab < 0:
		return errors.New("vocabulary, evaluation tokens and sample tokens must not be negative")
	case !(c.Temperature >= 0) || math.IsInf(c.Temperature, 0):
		return fmt.Errorf("temperature must be 0 (greedy) or positive, got %v", c.Temperature)
	case c.Resume && c.Checkpoint == "":
		return errors.New("resume needs a checkpoint path")
	}
	return nil
}

// LMStats is one progress report of RunLM.
type LMStats struct {
	Step            int64   `json:"step"`
	Loss            float64 `json:"loss"` // mean training loss since the last report
	LR              float64 `json:"lr"`
	TokensPerSecond float64 `json:"tokens_per_second"`
	Seconds         float64 `json:"seconds"` // training time so far
}

// LMResult is the outcome of RunLM. Perplexities are exp(mean negative
// log-likelihood per token) on the same validation tokens.
type LMResult struct {
	Model       string `json:"model"` // the full spec built
	Params      int64  `json:"params"`
	Data        string `json:"data"`
	CorpusBytes int    `json:"corpus_bytes,omitempty"` // of text read (text corpora)
	Vocab       int    `json:"vocab"`
	Seq         int    `json:"seq"`
	BatchSize   int    `json:"batch"`
	TrainTokens int    `json:"train_tokens"`
	ValTokens   int    `json:"val_tokens"`
	// EvalTokens is how many validation tokens were predicted in the
	// evaluation, by the model and by the bigram alike.
	EvalTokens      int     `json:"eval_tokens"`
	TokenizeSeconds float64 `json:"tokenize_seconds"` // BPE training and encoding
	Steps           int64   `json:"steps"`
	TokensTrained   int64   `json:"tokens_trained"`
	// Seconds is the training time (of all runs, when resumed), without
	// tokenization and evaluation.
	Seconds         float64 `json:"seconds"`
	TokensPerSecond float64 `json:"tokens_per_second"` // of this run
	TrainLoss       float64 `json:"train_loss"`        // mean over the last tenth of the run
	ValLoss         float64 `json:"val_loss"`
	ValPerplexity   float64 `json:"val_perplexity"`
	// BigramPerplexity is the count-based bigram's (text.TrainBigram on the
	// training split), with the add-k smoothing BigramK that does best on
	// the evaluated tokens.
	BigramPerplexity  float64 `json:"bigram_perplexity"`
	BigramK           float64 `json:"bigram_k"`
	UnigramPerplexity float64 `json:"unigram_perplexity"` // add-one unigram, for scale
	// Ratio is ValPerplexity / BigramPerplexity; the target is ≤ 0.6.
	Ratio       float64 `json:"ratio"`
	EvalSeconds float64 `json:"eval_seconds"`
	Prompt      string  `json:"prompt,omitempty"`
	Sample      string  `json:"sample,omitempty"`
	Resumed     bool    `json:"resumed"`
	Checkpoint  string  `json:"checkpoint,omitempty"`
}

// bigramKs are the add-k smoothings tried for the bigram reference.
var bigramKs = [...]float64{0.01, 0.03, 0.1, 0.3, 1}

// RunLM trains a language model on corpus with AdamW on next-token cross
// entropy, then evaluates its validation perplexity next to the bigram
// reference's on the same held-out tokens, and generates a sample from
// cfg.Prompt. A text corpus is tokenized with a byte-level BPE of cfg.Vocab
// tokens trained on it (or the checkpoint's, when resuming). Progress goes
// to out. When ctx is cancelled it saves a checkpoint (if configured) and
// returns ctx's error. A masked language model (BERT) trains with RunMLM.
func RunLM(ctx context.Context, cfg LMConfig, corpus Corpus, out io.Writer) (LMResult, error) {
	res := LMResult{Data: corpus.Name, BatchSize: cfg.BatchSize}
	p, err := prepareLM(cfg, corpus, causalLM(), out)
	if err != nil {
		return res, err
	}
	cfg, run := p.cfg, p.run
	if run.tm, err = metrics.NewTraining(cfg.Metrics); err != nil {
		return res, err
	}
	defer run.tm.Close()
	res.Model, res.Params, res.CorpusBytes, res.Vocab, res.Seq = run.spec, p.params, p.corpusBytes, p.modelVocab, run.seq
	res.TrainTokens, res.ValTokens, res.TokenizeSeconds, res.Resumed = len(p.train), len(p.val), p.tokenizeSeconds, p.resumed
	gcfg, err := models.ParseGPT(run.spec)
	if err != nil {
		return res, err
	}
	if err := p.trainAndSave(ctx, out); err != nil {
		return res, err
	}
	res.Steps, res.TrainLoss, res.TokensTrained, res.Seconds, res.TokensPerSecond = run.step, run.lastLoss, run.tokensTrained(), run.trained().Seconds(), run.tokensPerSecond()
	res.Checkpoint = cfg.Checkpoint

	t1 := time.Now()
	// The windows predict tokens 1..rows·seq of evalIDs; the references
	// predict exactly those.
	evalIDs, err := LMData{Val: p.val}.EvalIDs(cfg.EvalTokens, gcfg.Seq)
	if err != nil {
		return res, err
	}
	res.EvalTokens = len(evalIDs) - 1
	model := run.model
	if res.ValLoss, err = EvaluateLM(ctx, model, evalIDs, gcfg.Seq, cfg.BatchSize); err != nil {
		return res, err
	}
	res.ValPerplexity = math.Exp(res.ValLoss)
	run.tm.Eval(res.ValLoss, math.NaN())
	for _, k := range bigramKs {
		ref, err := text.TrainBigram(p.train, p.vocab, k)
		if err != nil {
			return res, err
		}
		pp, err := ref.Perplexity(evalIDs)
		if err != nil {
			return res, err
		}
		if res.BigramPerplexity == 0 || pp < res.BigramPerplexity {
			res.BigramPerplexity, res.BigramK = pp, k
		}
	}
	res.UnigramPerplexity = unigramPerplexity(p.train, evalIDs[1:], p.vocab)
	res.Ratio = res.ValPerplexity / res.BigramPerplexity
	res.EvalSeconds = time.Since(t1).Seconds()
	fmt.Fprintf(out, "validation perplexity %.2f (loss %.4f) on %d tokens; bigram %.2f (k=%g), unigram %.2f; ratio to the bigram %.3f\n",
		res.ValPerplexity, res.ValLoss, res.EvalTokens, res.BigramPerplexity, res.BigramK, res.UnigramPerplexity, res.Ratio)

	tok := run.tok
	if cfg.SampleTokens > 0 && tok == nil {
		fmt.Fprintln(out, "no sample: token data comes without its tokenizer, so the prompt cannot be encoded")
	}
	if cfg.SampleTokens > 0 && tok != nil {
		prompt := tok.Encode([]byte(cfg.Prompt))
		if len(prompt) == 0 {
			prompt = []int32{int32('\n')} // an empty prompt starts a paragraph
		}
		gen, err := Generate(ctx, model, gcfg, prompt, cfg.SampleTokens, cfg.Temperature, cfg.Seed)
		if err != nil {
			return res, err
		}
		b, err := tok.Decode(gen)
		if err != nil {
			return res, err
		}
		res.Prompt, res.Sample = cfg.Prompt, string(b)
	}
	return res, nil
}

// lmKind is what differs between the objectives in the training that
// RunLM (causal) and RunMLM (masked) share: prepareLM, lmRun.train and the
// checkpoint.
type lmKind struct {
	objective models.Objective
	// wrong explains that a model of another objective (0 for an image
	// classifier or an unknown name) is not for this trainer.
	wrong func(model string, objective models.Objective) error
	// spec completes a model spec for data of vocab token ids (lmSpec,
	// mlmSpec) and returns the full spec, the model's vocabulary and its
	// context.
	spec func(model string, vocab, seq int) (string, int, int, error)
	// build initialises the model of a full spec.
	build func(spec string, seed uint64) (*nn.Sequential, error)
	// load reads a checkpoint of this objective.
	load func(path string) (*lmCheckpoint, error)
	// setup gives run, whose spec, model and data are set, the objective's
	// inputs, loss, task and configuration metadata, for data of vocab
	// token ids.
	setup func(run *lmRun, vocab int) error
}

// causalLM returns the kind of RunLM: GPT on next-token cross entropy.
func causalLM() lmKind {
	return lmKind{
		objective: models.CausalLM,
		wrong: func(model string, o models.Objective) error {
			if o == models.MaskedLM {
				return fmt.Errorf("model %q is a masked language model: train it with RunMLM (want %s, e.g. gpt-mini)", model, models.LMUsage())
			}
			return fmt.Errorf("model %q is not a language model (want %s, e.g. gpt-mini)", model, models.LMUsage())
		},
		spec: func(model string, vocab, seq int) (string, int, int, error) {
			spec, g, err := lmSpec(model, vocab, seq)
			return spec, g.Vocab, g.Seq, err
		},
		build: models.BuildLM,
		load: func(path string) (*lmCheckpoint, error) {
			lm, st, err := loadLM(path)
			if err != nil {
				return nil, err
			}
			return &lmCheckpoint{spec: lm.Spec, data: lm.Data, tok: lm.Tokenizer, model: lm.Model, state: st}, nil
		},
		setup: func(run *lmRun, _ int) error {
			g, err := models.ParseGPT(run.spec)
			if err != nil {
				return err
			}
			gj, err := json.Marshal(gptJSON{g.Vocab, g.Seq, g.Hidden, g.Heads, g.Layers, g.FFN, g.Dropout})
			if err != nil {
				return err
			}
			run.task, run.meta = models.LanguageModeling.String(), map[string]string{metaGPT: string(gj)}
			run.inputs = func(b text.Batch, _ int64) (*tensor.Tensor, []int, error) { return b.X, b.Labels(), nil }
			run.loss = nn.SequenceCrossEntropy
			return nil
		},
	}
}

// lmCheckpoint is what RunLM and RunMLM resume from.
type lmCheckpoint struct {
	spec, data string
	tok        *text.Tokenizer // nil for token data
	model      *nn.Sequential
	state      *lmState
}

// lmPrep is a run ready to train, as prepareLM leaves it.
type lmPrep struct {
	cfg             LMConfig // with its defaults
	run             *lmRun
	sampler         *text.Sampler
	vocab           int // of the data: the tokenizer's, or the token corpus's
	modelVocab      int // of the model (a masked one's has [MASK] too)
	train, val      []int32
	corpusBytes     int
	tokenizeSeconds float64
	resumed         bool
	params          int64
}

// prepareLM does what RunLM and RunMLM share before training: it checks
// cfg, reads the checkpoint to resume from, tokenizes the corpus (with the
// checkpoint's tokenizer, or a BPE trained on it), completes the model
// spec, splits the tokens, builds (or restores) the model and its AdamW,
// and replays the batch sampler to the checkpoint's step.
func prepareLM(cfg LMConfig, corpus Corpus, kind lmKind, out io.Writer) (*lmPrep, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.ValFraction == 0 {
		cfg.ValFraction = 0.1
	}
	if o := models.ObjectiveOf(cfg.Model); o != kind.objective {
		return nil, kind.wrong(cfg.Model, o)
	}
	p := &lmPrep{cfg: cfg}

	// A resumed run takes the tokenizer, the model and the optimizer state
	// from the checkpoint; a new one trains the tokenizer.
	var ck *lmCheckpoint
	if cfg.Resume {
		var err error
		ck, err = kind.load(cfg.Checkpoint)
		switch {
		case err == nil:
			if ck.data != corpus.Name {
				return nil, fmt.Errorf("checkpoint %s was trained on %s, not %s", cfg.Checkpoint, ck.data, corpus.Name)
			}
			p.resumed = true
		case !errors.Is(err, os.ErrNotExist):
			return nil, err
		}
	}

	topts := TokenizeOptions{Vocab: cfg.Vocab, ValFraction: cfg.ValFraction, Seed: cfg.Seed, Log: out}
	if ck != nil && corpus.Text != nil {
		if topts.Tokenizer = ck.tok; topts.Tokenizer == nil {
			return nil, fmt.Errorf("checkpoint %s holds no tokenizer for text data", cfg.Checkpoint)
		}
	}
	d, err := Tokenize(corpus, topts)
	if err != nil {
		return nil, err
	}
	p.corpusBytes, p.tokenizeSeconds, p.vocab, p.train, p.val = len(corpus.Text), d.TokenizeSeconds, d.Vocab, d.Train, d.Val
	tok := d.Tokenizer

	spec, modelVocab, seq, err := kind.spec(cfg.Model, d.Vocab, cfg.Seq)
	if err != nil {
		return nil, err
	}
	if ck != nil && ck.spec != spec {
		return nil, fmt.Errorf("checkpoint %s holds model %q, not %q", cfg.Checkpoint, ck.spec, spec)
	}
	p.modelVocab = modelVocab
	if err := d.CheckContext(seq); err != nil {
		return nil, err
	}
	fmt.Fprintf(out, "%s: %d tokens (%d train, %d validation), vocabulary %d, tokenized in %.1fs\n",
		corpus.Name, d.Tokens(), len(p.train), len(p.val), d.Vocab, p.tokenizeSeconds)

	var model *nn.Sequential
	if ck != nil {
		model = ck.model
	} else if model, err = kind.build(spec, cfg.Seed); err != nil {
		return nil, err
	}
	params := model.Params()
	p.params = nn.NumParams(params)
	opt := optim.NewAdamW(params, optim.AdamWConfig{LR: cfg.LR, WeightDecay: cfg.WeightDecay, NoDecay: optim.NoDecayVectors})
	if p.sampler, err = text.NewSampler(p.train, cfg.BatchSize, seq, cfg.Seed); err != nil {
		return nil, err
	}
	p.run = &lmRun{cfg: cfg, spec: spec, seq: seq, data: corpus.Name, tok: tok, model: model, opt: opt}
	if err := kind.setup(p.run, d.Vocab); err != nil {
		return nil, err
	}
	if ck != nil {
		if err := ck.state.restore(p.run); err != nil {
			return nil, fmt.Errorf("checkpoint %s: %w", cfg.Checkpoint, err)
		}
		for range p.run.step {
			p.sampler.Next() // the batches trained before the checkpoint
		}
		fmt.Fprintf(out, "resumed from %s at step %d (%.0fs trained)\n", cfg.Checkpoint, p.run.step, p.run.before.Seconds())
	}
	fmt.Fprintf(out, "training %s (%d parameters) for %s, batch %d × %d tokens\n", spec, p.params, cfg.limits(), cfg.BatchSize, seq)
	return p, nil
}

// trainAndSave trains the prepared run to its limits and writes the final
// checkpoint, if configured.
func (p *lmPrep) trainAndSave(ctx context.Context, out io.Writer) error {
	if err := p.run.train(ctx, p.sampler, out); err != nil {
		return err
	}
	if p.cfg.Checkpoint != "" {
		return p.run.save()
	}
	return nil
}

// limits describes how long the run trains.
func (c LMConfig) limits() string {
	var l []string
	if c.Duration > 0 {
		l = append(l, c.Duration.String())
	}
	if c.Steps > 0 {
		l = append(l, fmt.Sprintf("%d steps", c.Steps))
	}
	return strings.Join(l, " or ")
}

// lmSpec completes a language-model spec: a GPT size without parameters
// gets ":VOCABxSEQ". A spec with parameters must fit the vocabulary (its
// VOCAB at least vocab) and, if seq is set, have that context.
func lmSpec(model string, vocab, seq int) (string, nn.GPTConfig, error) {
	spec := model
	if !strings.Contains(model, ":") {
		if seq == 0 {
			seq = models.DefaultSeq
		}
		spec = fmt.Sprintf("%s:%dx%d", model, vocab, seq)
	}
	gcfg, err := models.ParseGPT(spec)
	if err != nil {
		return "", nn.GPTConfig{}, err
	}
	if gcfg.Vocab < vocab {
		return "", nn.GPTConfig{}, fmt.Errorf("model %s has a vocabulary of %d, but the data has %d token ids: give the model no vocabulary (--model %s) or a larger one",
			spec, gcfg.Vocab, vocab, strings.SplitN(model, ":", 2)[0])
	}
	if seq != 0 && gcfg.Seq != seq {
		return "", nn.GPTConfig{}, fmt.Errorf("model %s has a context of %d tokens but --seq is %d: set one of them", spec, gcfg.Seq, seq)
	}
	return spec, gcfg, nil
}

// lmRun is the training state of RunLM and RunMLM.
type lmRun struct {
	cfg   LMConfig
	spec  string
	seq   int // the model's context, the windows' length
	data  string
	tok   *text.Tokenizer
	model *nn.Sequential
	opt   *optim.AdamW
	// task and meta are the checkpoint's skyhive.task and the objective's
	// own metadata (its model configuration).
	task string
	meta map[string]string
	// inputs turns the windows sampled for a step into the model's input
	// and targets; loss scores the logits against the targets.
	inputs func(b text.Batch, step int64) (*tensor.Tensor, []int, error)
	loss   func(logits *tensor.Tensor, targets []int) (float32, *tensor.Tensor)

	step      int64         // steps done
	startStep int64         // steps done before this run (resumed)
	before    time.Duration // training time before this run (resumed)
	elapsed   time.Duration // training time of this run
	lastLoss  float64       // mean loss of the last report interval
	tm        *metrics.Training
}

// trained is the training time of all runs.
func (r *lmRun) trained() time.Duration { return r.before + r.elapsed }

// tokensTrained counts the tokens of the windows of every step, resumed
// ones included.
func (r *lmRun) tokensTrained() int64 { return r.step * int64(r.cfg.BatchSize*r.seq) }

// tokensPerSecond is this run's training throughput (0 before a step).
func (r *lmRun) tokensPerSecond() float64 {
	if s := r.elapsed.Seconds(); s > 0 {
		return float64((r.step-r.startStep)*int64(r.cfg.BatchSize*r.seq)) / s
	}
	return 0
}

// progress is the fraction of the run done: the larger of the steps' and
// the time's, so the run ends at the first limit reached.
func (r *lmRun) progress() float64 {
	var p float64
	if r.cfg.Steps > 0 {
		p = float64(r.step) / float64(r.cfg.Steps)
	}
	if r.cfg.Duration > 0 {
		p = max(p, r.trained().Seconds()/r.cfg.Duration.Seconds())
	}
	return min(p, 1)
}

// lr is the learning rate of the next step: linear warm-up over Warmup
// steps, then a cosine from the peak to minLRFraction of it over the
// progress of the run.
func (r *lmRun) lr() float64 {
	peak := r.cfg.LR
	if r.step < r.cfg.Warmup {
		return peak * float64(r.step+1) / float64(r.cfg.Warmup)
	}
	lo := peak * minLRFraction
	return lo + (peak-lo)*0.5*(1+math.Cos(math.Pi*r.progress()))
}

// train runs steps until the run's limits, reporting every tenth of it.
func (r *lmRun) train(ctx context.Context, sampler *text.Sampler, out io.Writer) error {
	params := r.model.Params()
	tokens := int64(r.cfg.BatchSize * r.seq)
	r.startStep = r.step
	start := time.Now()
	tenth := func() int { return int(math.Floor(r.progress()*10 + 1e-9)) }
	reported := tenth()
	var lossSum float64
	var lossN int
	lastStep, lastTime := r.step, time.Duration(0)
	for r.progress() < 1 {
		if err := ctx.Err(); err != nil {
			return r.interrupted(err)
		}
		x, targets, err := r.inputs(sampler.Next(), r.step)
		if err != nil {
			return fmt.Errorf("step %d: %w", r.step+1, err)
		}
		r.opt.SetLR(r.lr())
		r.opt.ZeroGrad()
		logits, st := r.model.Forward(nn.Ctx{Train: true}, x)
		loss, dlogits := r.loss(logits, targets)
		if math.IsNaN(float64(loss)) || math.IsInf(float64(loss), 0) {
			return fmt.Errorf("step %d: loss is %v (try a lower learning rate, --lr)", r.step+1, loss)
		}
		r.model.Backward(st, dlogits)
		if r.cfg.ClipNorm > 0 {
			optim.ClipGradNorm(params, r.cfg.ClipNorm)
		}
		r.opt.Step()
		r.tm.Step(r.cfg.BatchSize, float64(loss))
		r.step++
		r.elapsed = time.Since(start)
		lossSum += float64(loss)
		lossN++
		if t := tenth(); t > reported || r.step == r.startStep+1 {
			reported = t
			p := r.progress()
			r.lastLoss = lossSum / float64(lossN)
			st := LMStats{Step: r.step, Loss: r.lastLoss, LR: r.opt.LR(), Seconds: r.trained().Seconds()}
			if dt := (r.elapsed - lastTime).Seconds(); dt > 0 {
				st.TokensPerSecond = float64((r.step-lastStep)*tokens) / dt
			}
			left := time.Duration(0)
			if p > 0 {
				left = time.Duration(float64(r.trained()) * (1 - p) / p)
			}
			fmt.Fprintf(out, "step %d (%3.0f%%): loss %.4f, lr %.2g, %.0f tokens/s, %s trained, %s left\n",
				st.Step, 100*p, st.Loss, st.LR, st.TokensPerSecond, r.trained().Round(time.Second), left.Round(time.Second))
			if r.cfg.Stats != nil {
				if err := json.NewEncoder(r.cfg.Stats).Encode(st); err != nil {
					return fmt.Errorf("writing stats: %w", err)
				}
			}
			if r.cfg.Checkpoint != "" && p < 1 {
				if err := r.save(); err != nil {
					return err
				}
			}
			lossSum, lossN = 0, 0
			lastStep, lastTime = r.step, r.elapsed
		}
	}
	return nil
}

// interrupted saves a checkpoint, if configured, and returns cause.
func (r *lmRun) interrupted(cause error) error {
	if r.cfg.Checkpoint == "" {
		return cause
	}
	if err := r.save(); err != nil {
		return errors.Join(cause, err)
	}
	return fmt.Errorf("%w (checkpoint saved to %s at step %d; resume from it to continue)", cause, r.cfg.Checkpoint, r.step)
}

// EvaluateLM returns the mean next-token cross entropy (nats per token) of
// model on tokens, in inference mode: the tokens are cut into consecutive
// windows of seq (text.Windows), batch windows at a time, and every token
// of the windows but the first is predicted once from the tokens before it
// in its window.
func EvaluateLM(ctx context.Context, model nn.Module, tokens []int32, seq, batch int) (float64, error) {
	windows, err := text.Windows(tokens, batch, seq)
	if err != nil {
		return 0, err
	}
	var sum float64
	var n int
	for b := range windows {
		if err := ctx.Err(); err != nil {
			return 0, err
		}
		logits, _ := model.Forward(nn.Ctx{}, b.X)
		loss, _ := nn.SequenceCrossEntropy(logits, b.Labels())
		k := len(b.Y.Data)
		sum += float64(loss) * float64(k)
		n += k
	}
	return sum / float64(n), nil
}

// unigramPerplexity is the perplexity on eval of the add-one unigram
// distribution of train's tokens.
func unigramPerplexity(train, eval []int32, vocab int) float64 {
	counts := make([]float64, vocab)
	for _, t := range train {
		counts[t]++
	}
	total := float64(len(train) + vocab)
	var nll float64
	for _, t := range eval {
		nll -= math.Log((counts[t] + 1) / total)
	}
	return math.Exp(nll / float64(len(eval)))
}
