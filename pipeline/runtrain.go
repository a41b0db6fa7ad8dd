package pipeline

import (
	"context"
	"fmt"
	"io"
	"math"
	"strings"

	"github.com/skyhive/skyhive/data"
	"github.com/skyhive/skyhive/text"
	"github.com/skyhive/skyhive/train"
)

// trainImage trains an image classifier for Steps iterations (or Epochs),
// after measuring the plans of Compare, and evaluates it on the test set.
func (r *coordRun) trainImage(ctx context.Context, sc *Scenario, trainSet, testSet *data.Dataset) error {
	c, out := &r.cfg, r.log
	loader, err := data.NewLoader(trainSet, data.BatchOptions{Size: c.Batch, Shuffle: true, Seed: c.Seed, DropLast: true})
	if err != nil {
		return err
	}
	total := int64(loader.Len() * c.Epochs)
	if c.Steps > 0 {
		total = int64(c.Steps)
	}
	s, err := sc.Start(ctx, r.session(c.Model, c.Batch, c.LR, c.Warmup, total, 100, c.Clip))
	if err != nil {
		return err
	}
	topts := TrainOptions{Data: NewBatches(loader), Steps: int(total), Eval: testSet, EvalBatch: 512,
		OnIteration: r.onIteration(c.Batch), Stats: c.Stats, BeforeStep: sc.FailureDrill(c.KillWorker, c.KillAt, out)}
	var compared []PlanMeasurement
	if len(c.Compare) > 0 {
		if compared, err = r.measurePlans(ctx, s, trainSet); err != nil {
			if ctx.Err() != nil {
				return err
			}
			// A worker lost while comparing is the training's to recover
			// from (it re-plans); the comparison is left out.
			fmt.Fprintf(out, "comparing plans failed, training without it: %v\n", err)
			compared = nil
		}
	}
	tr, err := s.Train(ctx, topts)
	if err != nil {
		return err
	}
	res := RunResult{
		Iterations: tr.Iterations, Ran: tr.Ran, Seconds: tr.Duration.Seconds(), FinalLoss: tr.Last.Loss, TestLoss: tr.TestLoss, TestAccuracy: tr.TestAccuracy,
		Plan: s.Plan(), Workers: sc.Coordinator().Workers(), Events: tr.Events, Last: &tr.Last, Compare: compared,
		Config: map[string]any{"model": c.Model, "batch": c.Batch, "micro": c.Micro, "schedule": c.Schedule.String(), "strategy": c.Strategy},
	}
	if c.JSON {
		return r.printJSON(res)
	}
	fmt.Fprintf(r.stdout, "pipeline: %d iterations run in %.1fs (%.1f ms/iteration; %d in all), final loss %.4f, test accuracy %.2f%%\n",
		res.Ran, res.Seconds, 1e3*res.Seconds/float64(max(res.Ran, 1)), res.Iterations, res.FinalLoss, 100*res.TestAccuracy)
	return nil
}

// measurePlans measures each of Compare's strategies' plans for
// CompareRounds iterations in turn (real training steps, on batches of
// their own), then installs Strategy's plan again for the training.
func (r *coordRun) measurePlans(ctx context.Context, s *Session, trainSet *data.Dataset) ([]PlanMeasurement, error) {
	c := &r.cfg
	loader, err := data.NewLoader(trainSet, data.BatchOptions{Size: c.Batch, Shuffle: true, Seed: c.Seed + 1, DropLast: true})
	if err != nil {
		return nil, err
	}
	// Train on Strategy's plan: the one just measured if it was compared.
	return s.MeasureStrategies(ctx, c.Compare, c.Strategy, MeasureOptions{Data: NewBatches(loader), Rounds: c.CompareRounds, Warmup: 1, Calibrate: compareCalibration}, r.log)
}

// compareCalibration iterations of the first plan calibrate the cost
// model before the plans of TrainConfig.Compare are planned and
// predicted; each install of a plan then runs one unmeasured iteration
// before its measured one (the first after a switch is slower than the
// plan's steady state).
const compareCalibration = 5

// lmText is a language model's data for the pipeline: the spec completed
// with the vocabulary and context, and the tokens split into training and
// validation.
type lmText struct {
	name       string
	spec       string
	info       ModelInfo
	train, val []int32
}

// loadText reads and tokenizes a language model's data as `skyhive train`
// does (train.Tokenize): a byte-level BPE of Text.Vocab tokens trained on
// the text (or the ids of a token file), a tenth held out for validation,
// of which the first Text.EvalTokens are evaluated.
func loadText(cfg TrainConfig, out io.Writer) (*lmText, error) {
	dataset, l := cfg.Data, cfg.Text
	if dataset == "" {
		dataset = "gcide"
	}
	if !train.IsTextData(dataset) {
		return nil, fmt.Errorf("%s is a language model and %s is images: train it on text (--data %s)", cfg.Model, dataset, train.TextDataUsage)
	}
	if cfg.Steps <= 0 {
		return nil, fmt.Errorf("a language model trains for --steps N (got %d)", cfg.Steps)
	}
	tokenVocab := 0
	if strings.HasPrefix(dataset, "tokens:") {
		tokenVocab = l.Vocab
	}
	corpus, err := train.LoadCorpus(dataset, l.CorpusBytes, l.TokenWidth, tokenVocab)
	if err != nil {
		return nil, err
	}
	d, err := train.Tokenize(corpus, train.TokenizeOptions{Vocab: l.Vocab, Seed: cfg.Seed, Log: out})
	if err != nil {
		return nil, err
	}
	spec := cfg.Model
	if !strings.Contains(spec, ":") {
		spec = fmt.Sprintf("%s:%dx%d", spec, d.Vocab, l.Seq)
	}
	info, err := DescribeModel(spec)
	if err != nil {
		return nil, err
	}
	if info.Classes < d.Vocab {
		return nil, fmt.Errorf("model %s has a vocabulary of %d, but the data has %d token ids: give the model no vocabulary (--model %s) or a larger one",
			spec, info.Classes, d.Vocab, strings.SplitN(spec, ":", 2)[0])
	}
	if l.Seq != 0 && info.Input[0] != l.Seq {
		return nil, fmt.Errorf("model %s has a context of %d tokens but --seq is %d: set one of them", spec, info.Input[0], l.Seq)
	}
	if err := d.CheckContext(info.Input[0]); err != nil {
		return nil, err
	}
	val, err := d.EvalIDs(l.EvalTokens, info.Input[0])
	if err != nil {
		return nil, err
	}
	fmt.Fprintf(out, "%s: %d tokens (%d train, %d validation), vocabulary %d, model %s\n", corpus.Name, d.Tokens(), len(d.Train), len(val), d.Vocab, spec)
	return &lmText{name: corpus.Name, spec: spec, info: info, train: d.Train, val: val}, nil
}

// trainLM trains a language model for Steps iterations on windows drawn
// from the training tokens, then reports the validation loss and
// perplexity of the gathered model.
func (r *coordRun) trainLM(ctx context.Context, sc *Scenario, corpus *lmText) error {
	c := &r.cfg
	total := int64(c.Steps)
	s, err := sc.Start(ctx, r.session(corpus.spec, c.Batch, c.LR, c.Warmup, total, 10, c.Clip))
	if err != nil {
		return err
	}
	sampler, err := text.NewSampler(corpus.train, c.Batch, corpus.info.Input[0], c.Seed)
	if err != nil {
		return err
	}
	for range s.Iter() {
		sampler.Next() // a resumed run continues the sequence of batches
	}
	var compared []PlanMeasurement
	if len(c.Compare) > 0 {
		own, err := text.NewSampler(corpus.train, c.Batch, corpus.info.Input[0], c.Seed+1)
		if err != nil {
			return err
		}
		compared, err = s.MeasureStrategies(ctx, c.Compare, c.Strategy, MeasureOptions{Tokens: own, Rounds: c.CompareRounds, Warmup: 1, Calibrate: compareCalibration}, r.log)
		if err != nil {
			if ctx.Err() != nil {
				return err
			}
			fmt.Fprintf(r.log, "comparing plans failed, training without it: %v\n", err)
			compared = nil
		}
	}
	tr, err := s.Train(ctx, TrainOptions{Tokens: sampler, Steps: int(total), EvalTokens: corpus.val, EvalBatch: 16,
		OnIteration: r.onIteration(c.Batch), Stats: c.Stats, BeforeStep: sc.FailureDrill(c.KillWorker, c.KillAt, r.log)})
	if err != nil {
		return err
	}
	res := LMRunResult{Model: corpus.spec, Data: corpus.name, ValTokens: len(corpus.val),
		Iterations: tr.Iterations, Ran: tr.Ran, Seconds: tr.Duration.Seconds(), FinalLoss: tr.Last.Loss, FinalAccuracy: tr.Last.Accuracy,
		ValLoss: tr.TestLoss, ValPerplexity: math.Exp(tr.TestLoss), Plan: s.Plan(), Workers: sc.Coordinator().Workers(), Events: tr.Events, Last: &tr.Last, Compare: compared,
		Config: map[string]any{"model": corpus.spec, "batch": c.Batch, "micro": c.Micro, "schedule": c.Schedule.String(), "strategy": c.Strategy, "lr": c.LR}}
	if c.JSON {
		return r.printJSON(res)
	}
	fmt.Fprintf(r.stdout, "pipeline: %d iterations run in %.1fs (%.1f ms/iteration; %d in all), final loss %.4f, token accuracy %.2f%%; validation loss %.4f, perplexity %.2f on %d tokens (%s)\n",
		res.Ran, res.Seconds, 1e3*res.Seconds/float64(max(res.Ran, 1)), res.Iterations, res.FinalLoss, 100*res.FinalAccuracy, res.ValLoss, res.ValPerplexity, res.ValTokens, res.Model)
	return nil
}
