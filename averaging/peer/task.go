// What a peer learns: Fashion-MNIST with an image classifier, or text with
// a GPT language model. A task holds the data, draws the peer's batches,
// computes gradients and evaluates.

package peer

import (
	"context"
	"fmt"
	"math"
	"strings"

	libp2ppeer "github.com/libp2p/go-libp2p/core/peer"

	"github.com/skyhive/skyhive/data"
	"github.com/skyhive/skyhive/models"
	"github.com/skyhive/skyhive/nn"
	"github.com/skyhive/skyhive/optim"
	"github.com/skyhive/skyhive/text"
	"github.com/skyhive/skyhive/train"
)

// task is the data and loss of a peer's training.
type task interface {
	// seed prepares the peer's batches, drawn with seed (batchSeed).
	seed(seed uint64) error
	// next draws the next training batch.
	next()
	// grad adds the gradients of the batch drawn last to the model's and
	// returns its mean loss and its examples.
	grad(model *nn.Sequential) (loss float64, examples int, err error)
	// eval evaluates model on held-out data, filling the accuracy or
	// perplexity and the loss of e.
	eval(ctx context.Context, model *nn.Sequential, e *Eval) error
}

// setup is what Run builds before it joins the network.
type setup struct {
	task  task
	model *nn.Sequential
	inner optim.Optimizer
	// sig is the model signature peers of one run must share.
	sig string
	// lm is set for language models.
	lm *lmTask
}

// batchSeed is the seed of a peer's batches: the run's seed mixed with the
// peer's ID, so that every peer draws its own.
func batchSeed(seed uint64, id libp2ppeer.ID) uint64 { return seed ^ idSeed(id) }

// isLM reports whether the model spec names a language model of the
// registry, with its parameters ("gpt-mini:1024x64") or without
// ("gpt-mini").
func isLM(spec string) bool { return train.IsLanguageModel(spec) }

// newSetup loads the data and builds the model and the optimizer of cfg;
// the task draws no batch before its seed is set.
func newSetup(ctx context.Context, cfg Config) (*setup, error) {
	if isLM(cfg.Model) {
		return newLMSetup(cfg)
	}
	trainSet, err := data.LoadFashionMNISTContext(ctx, cfg.DataDir, data.Train, data.LoadOptions{Standardize: true, Limit: cfg.Limit})
	if err != nil {
		return nil, err
	}
	testSet, err := data.LoadFashionMNISTContext(ctx, cfg.DataDir, data.Test, data.LoadOptions{Standardize: true, Limit: cfg.EvalExamples})
	if err != nil {
		return nil, err
	}
	if cfg.Shards > 0 {
		if trainSet, err = trainSet.Shard(cfg.Shard, cfg.Shards); err != nil {
			return nil, err
		}
	}
	model, err := models.Build(cfg.Model, cfg.Seed)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrConfig, err)
	}
	if trainSet.Len() < cfg.Batch {
		return nil, fmt.Errorf("%w: %d training examples are fewer than a batch", ErrConfig, trainSet.Len())
	}
	return &setup{
		task:  &imageTask{batch: cfg.Batch, train: trainSet, test: testSet},
		model: model,
		inner: optim.NewSGD(model.Params(), optim.SGDConfig{LR: cfg.LR, Momentum: cfg.Momentum}),
		sig:   ModelSignature(cfg.Model, nn.NumParams(model.Params()), ""),
	}, nil
}

// imageTask trains an image classifier on Fashion-MNIST with softmax cross
// entropy, in epochs of the peer's own shuffled order.
type imageTask struct {
	batch       int
	loader      *data.Loader
	train, test *data.Dataset
	order       []int
	epoch       int
	cur         data.Batch
}

func (t *imageTask) seed(seed uint64) error {
	loader, err := data.NewLoader(t.train, data.BatchOptions{Size: t.batch, Shuffle: true, Seed: seed, DropLast: true})
	if err != nil {
		return err
	}
	if loader.Len() == 0 {
		return fmt.Errorf("%w: %d training examples are fewer than a batch", ErrConfig, t.train.Len())
	}
	t.loader = loader
	return nil
}

func (t *imageTask) next() {
	if len(t.order) < t.batch {
		t.order = t.loader.Order(t.epoch)
		t.epoch++
	}
	t.cur = t.train.Gather(t.order[:t.batch])
	t.order = t.order[t.batch:]
}

func (t *imageTask) grad(model *nn.Sequential) (float64, int, error) {
	logits, st := model.Forward(nn.Ctx{Train: true}, t.cur.X)
	loss, dlogits := nn.SoftmaxCrossEntropy(logits, t.cur.Y)
	model.Backward(st, dlogits)
	return float64(loss), t.batch, nil
}

func (t *imageTask) eval(_ context.Context, model *nn.Sequential, e *Eval) error {
	e.Loss, e.Accuracy = train.Evaluate(model, t.test, 500)
	return nil
}

// lmValFraction is the share of the tokens held out for validation, as in
// `skyhive train`.
const lmValFraction = 0.1

// lmEvalBatch is how many windows an evaluation forwards at once.
const lmEvalBatch = 32

// lmTask trains a GPT on next-token prediction: every peer derives the same
// tokenizer and split from the same data and seed, and samples its own
// windows from the training tokens.
type lmTask struct {
	spec    string
	gpt     nn.GPTConfig
	data    train.LMData
	sampler *text.Sampler
	evalIDs []int32 // validation tokens evaluated
	unigram float64 // the add-one unigram's perplexity on evalIDs
	batch   int
	cur     text.Batch
}

func newLMSetup(cfg Config) (*setup, error) {
	tokenVocab := 0
	if strings.HasPrefix(cfg.Data, "tokens:") {
		tokenVocab = cfg.Vocab
	}
	corpus, err := train.LoadCorpus(cfg.Data, cfg.CorpusBytes, cfg.TokenWidth, tokenVocab)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrConfig, err)
	}
	d, err := train.TokenizeLM(corpus, cfg.Vocab, lmValFraction, cfg.Seed)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrConfig, err)
	}
	spec, gcfg, err := train.LMSpec(cfg.Model, d.Vocab, cfg.Seq)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrConfig, err)
	}
	if need := gcfg.Seq + 1; len(d.Train) < need || len(d.Val) < need {
		return nil, fmt.Errorf("%w: %s gives %d training and %d validation tokens, but each needs at least context + 1 = %d; read more text (--corpus-bytes) or use a shorter context (--seq)",
			ErrConfig, cfg.Data, len(d.Train), len(d.Val), need)
	}
	model, err := models.BuildLM(spec, cfg.Seed)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrConfig, err)
	}
	evalIDs := d.Val
	if cfg.EvalTokens > 0 && len(evalIDs) > cfg.EvalTokens+1 {
		evalIDs = evalIDs[:cfg.EvalTokens+1]
	}
	rows := (len(evalIDs) - 1) / gcfg.Seq
	if rows < 1 {
		return nil, fmt.Errorf("%w: %d evaluation tokens are fewer than a context of %d; raise --eval-tokens", ErrConfig, len(evalIDs)-1, gcfg.Seq)
	}
	evalIDs = evalIDs[:rows*gcfg.Seq+1]
	t := &lmTask{
		spec: spec, gpt: gcfg, data: d, evalIDs: evalIDs, batch: cfg.Batch,
		unigram: train.UnigramPerplexity(d.Train, evalIDs[1:], d.Vocab),
	}
	adamw := optim.NewAdamW(model.Params(), optim.AdamWConfig{LR: cfg.LR, WeightDecay: cfg.WeightDecay, NoDecay: optim.NoDecayVectors})
	return &setup{
		task:  t,
		model: model,
		inner: &clippedAdamW{AdamW: adamw, clip: cfg.ClipNorm},
		sig:   ModelSignature(spec, nn.NumParams(model.Params()), d.Signature()),
		lm:    t,
	}, nil
}

// ModelSignature is the model signature of a peer training the registry
// model spec, of params parameters, on data (a language model's
// train.LMData.Signature; "" for an image classifier): peers of a run must
// share it. The daemon gives a PyTorch twin of a registry model the
// signature a Go peer of the same model and data has, so that the two
// average together.
func ModelSignature(spec string, params int64, data string) string {
	if data == "" {
		return fmt.Sprintf("%s/%d", spec, params)
	}
	return fmt.Sprintf("%s/%d/%s", spec, params, data)
}

func (t *lmTask) seed(seed uint64) error {
	s, err := text.NewSampler(t.data.Train, t.batch, t.gpt.Seq, seed)
	t.sampler = s
	return err
}

func (t *lmTask) next() { t.cur = t.sampler.Next() }

func (t *lmTask) grad(model *nn.Sequential) (float64, int, error) {
	logits, st := model.Forward(nn.Ctx{Train: true}, t.cur.X)
	loss, dlogits := nn.SequenceCrossEntropy(logits, t.cur.Labels())
	if math.IsNaN(float64(loss)) || math.IsInf(float64(loss), 0) {
		return 0, 0, fmt.Errorf("the training loss is %v (try a lower learning rate, --lr)", loss)
	}
	model.Backward(st, dlogits)
	return float64(loss), t.batch, nil
}

func (t *lmTask) eval(ctx context.Context, model *nn.Sequential, e *Eval) error {
	loss, err := train.EvaluateLM(ctx, model, t.evalIDs, t.gpt.Seq, lmEvalBatch)
	if err != nil {
		return err
	}
	e.Loss, e.Perplexity = loss, math.Exp(loss)
	return nil
}

// clippedAdamW is AdamW that first clips the global norm of the gradients
// it steps with. Inside the averaging optimizer it clips the gradients
// averaged over the peers (with all-reduce SGD), as one process training
// on the peers' batches together would.
type clippedAdamW struct {
	*optim.AdamW
	clip float64 // 0: no clipping
}

// Step clips the gradients and applies AdamW's update.
func (o *clippedAdamW) Step() {
	if o.clip > 0 {
		optim.ClipGradNorm(o.Params(), o.clip)
	}
	o.AdamW.Step()
}

var _ optim.Optimizer = (*clippedAdamW)(nil)
