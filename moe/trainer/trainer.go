// Package trainer runs the trainers of a decentralized mixture of experts
// (DMoE) against a swarm of expert servers: the role of `skyhive train
// moe` (RunRole, on a node of its own) and the loopback swarm of `skyhive
// demo moe` (RunDemo). A DMoE classifier trains on Fashion-MNIST with
// concurrent trainers sharing the local layers (client.Trainer); a DMoE
// transformer language model trains on text (client.LM, client.TrainLM).
// Both take their options from launch.MoETrainer, the role's typed config.
package trainer

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"

	"github.com/skyhive/skyhive/data"
	"github.com/skyhive/skyhive/launch"
	"github.com/skyhive/skyhive/metrics"
	"github.com/skyhive/skyhive/moe"
	"github.com/skyhive/skyhive/moe/client"
	"github.com/skyhive/skyhive/moe/server"
	"github.com/skyhive/skyhive/netem"
	"github.com/skyhive/skyhive/p2p"
	"github.com/skyhive/skyhive/train"
)

// DefaultMaxFailed is the default MaxFailedSteps: a run in which more than
// a tenth of the steps failed has failed.
const DefaultMaxFailed = 0.1

// Epoch is one stats line of a run: an epoch of a classifier, a tenth of
// a language model's steps.
type Epoch struct {
	Epoch        int     `json:"epoch"`
	Steps        int64   `json:"steps"`
	Failed       int64   `json:"failed_steps"`
	Samples      int64   `json:"samples"`
	TrainLoss    float64 `json:"train_loss"`
	TestAccuracy float64 `json:"test_accuracy"`
	Seconds      float64 `json:"seconds"`
}

// Result is a run's outcome, as the JSON output prints it.
type Result struct {
	TestAccuracy float64 `json:"test_accuracy"`
	Steps        int64   `json:"steps"`
	Failed       int64   `json:"failed_steps"`
	Seconds      float64 `json:"seconds"`
	Epochs       []Epoch `json:"epochs"`
	// ExpertCalls and ExpertBatches count what the servers answered
	// (RunDemo only).
	ExpertCalls   int64 `json:"expert_calls,omitempty"`
	ExpertBatches int64 `json:"expert_batches,omitempty"`
	// Err is the first failed step's error.
	Err error `json:"-"`
	// A language model reports its data, vocabulary, training loss and
	// validation loss and perplexity instead of a test accuracy.
	Data          string  `json:"data,omitempty"`
	Vocab         int     `json:"vocab,omitempty"`
	EvalTokens    int     `json:"eval_tokens,omitempty"`
	TrainLoss     float64 `json:"train_loss,omitempty"`
	ValLoss       float64 `json:"val_loss,omitempty"`
	ValPerplexity float64 `json:"val_perplexity,omitempty"`
}

// Job is a training run set up from its config: the grids, the trainers'
// emulated link and the data, all read before the trainers join a swarm.
type Job struct {
	cfg   launch.MoETrainer
	grids []moe.Grid
	link  netem.LinkParams
	data  moeData
	// hidden is the model's hidden size: the config's, DefaultHidden
	// without one, or the experts' (MatchExperts).
	hidden int
	// live receives the training numbers for the status record, tm for
	// the metrics (nil: none).
	live *metrics.Live
	tm   *metrics.Training
}

// NewJob checks c, the run's options, and reads what it trains on: the
// grids, the trainers' emulated link and the data (a text corpus is
// tokenized, with notices on log). Hidden 0 is server.DefaultHidden until
// MatchExperts takes the experts'.
func NewJob(c launch.MoETrainer, log io.Writer) (*Job, error) {
	if err := Check(c); err != nil {
		return nil, err
	}
	j := &Job{cfg: c, hidden: c.Hidden}
	if j.hidden == 0 {
		j.hidden = server.DefaultHidden
	}
	var err error
	if j.grids, err = ParseGrids(c.Grids); err != nil {
		return nil, fmt.Errorf("grids: %w", err)
	}
	j.link = netem.LinkParams{Latency: time.Duration(c.Latency), Bandwidth: c.Bandwidth * 1e6}
	if j.data, err = j.loadData(log); err != nil {
		return nil, err
	}
	return j, nil
}

// Check reports the first option of c that a job refuses before it reads
// anything; the error is a *launch.FieldError.
func Check(c launch.MoETrainer) error {
	switch {
	case c.Latency < 0 || c.Bandwidth < 0:
		return &launch.FieldError{Fields: []string{"latency", "bandwidth"}, Text: "the emulated %s and %s must not be negative"}
	case c.MaxFailedSteps > 1:
		return &launch.FieldError{Fields: []string{"max_failed_steps"}, Text: fmt.Sprintf("%%s %g: a fraction of the steps, at most 1", c.MaxFailedSteps)}
	}
	return nil
}

// Grids are the run's DMoE grids, one per layer or block.
func (j *Job) Grids() []moe.Grid { return j.grids }

// Link is the trainers' emulated link.
func (j *Job) Link() netem.LinkParams { return j.link }

// Hidden is the model's hidden size.
func (j *Job) Hidden() int { return j.hidden }

// ParseGrids parses grids written as "ffn.16.16,att.8.8":
// PREFIX.SIZE[.SIZE…], comma-separated.
func ParseGrids(s string) ([]moe.Grid, error) {
	var out []moe.Grid
	for g := range strings.SplitSeq(s, ",") {
		parts := strings.Split(strings.TrimSpace(g), ".")
		if len(parts) < 2 {
			return nil, fmt.Errorf("grid %q: want PREFIX.SIZE[.SIZE…]", g)
		}
		grid := moe.Grid{Prefix: parts[0]}
		for _, p := range parts[1:] {
			n, err := strconv.Atoi(p)
			if err != nil {
				return nil, fmt.Errorf("grid %q: %w", g, err)
			}
			grid.Size = append(grid.Size, n)
		}
		if err := grid.Validate(); err != nil {
			return nil, err
		}
		out = append(out, grid)
	}
	return out, nil
}

// EmulateLink wraps tr so that each request and each response crosses
// link (netem's link model); a zero link leaves tr as it is.
func EmulateLink(tr p2p.Transport, link netem.LinkParams, seed uint64) (p2p.Transport, error) {
	if link == (netem.LinkParams{}) {
		return tr, nil
	}
	n, err := netem.New(netem.Uniform(link), seed)
	if err != nil {
		return nil, err
	}
	return netem.NewTransport(tr, n, netem.UniformRegion)
}

// moeData is what a run trains on: Fashion-MNIST for a DMoE classifier,
// or the tokens of a DMoE language model.
type moeData struct {
	trainSet, testSet *data.Dataset
	lm                *corpus
}

// corpus is a tokenized text corpus split for training and validation.
type corpus struct {
	name       string
	vocab      int
	train, val []int32
}

// loadData reads the data: Fashion-MNIST, or a text corpus that it
// tokenizes as every language-model command does (train.Tokenize: a
// byte-level BPE of Vocab tokens trained on it, a tenth for validation,
// of which the first EvalTokens are evaluated).
func (j *Job) loadData(log io.Writer) (moeData, error) {
	c := j.cfg
	if !train.IsTextData(c.Data) {
		if c.Data != "fashion-mnist" {
			return moeData{}, fmt.Errorf("data %q: want fashion-mnist or text (%s)", c.Data, train.TextDataUsage)
		}
		return loadFashionMNIST(c.DataDir, c.Limit)
	}
	switch {
	case c.Seq < 1 || c.Heads < 1 || j.hidden%c.Heads != 0:
		return moeData{}, fmt.Errorf("a language model's --seq %d and --heads %d must be positive, and --heads must divide --hidden %d", c.Seq, c.Heads, j.hidden)
	case c.EvalTokens < 0 || c.Clip < 0:
		return moeData{}, errors.New("a language model's --eval-tokens and --clip must not be negative")
	}
	corp, err := train.LoadCorpus(c.Data, c.CorpusBytes, c.TokenWidth, c.Vocab)
	if err != nil {
		return moeData{}, err
	}
	d, err := train.Tokenize(corp, train.TokenizeOptions{Vocab: c.Vocab, Seed: c.Seed, Log: log})
	if err != nil {
		return moeData{}, fmt.Errorf("data %s: %w", corp.Name, err)
	}
	if err := d.CheckContext(c.Seq); err != nil {
		return moeData{}, fmt.Errorf("data %s: %w", corp.Name, err)
	}
	val, err := d.EvalIDs(c.EvalTokens, c.Seq)
	if err != nil {
		return moeData{}, fmt.Errorf("data %s: %w", corp.Name, err)
	}
	return moeData{lm: &corpus{name: corp.Name, vocab: d.Vocab, train: d.Train, val: val}}, nil
}

// loadFashionMNIST reads the training set (the first limit examples; 0:
// all) and the test set, standardized.
func loadFashionMNIST(dir string, limit int) (moeData, error) {
	if limit < 0 {
		return moeData{}, fmt.Errorf("a --limit of %d examples: must not be negative", limit)
	}
	trainSet, err := data.LoadFashionMNIST(dir, data.Train, data.LoadOptions{Standardize: true, Limit: limit})
	if err != nil {
		return moeData{}, err
	}
	testSet, err := data.LoadFashionMNIST(dir, data.Test, data.LoadOptions{Standardize: true})
	return moeData{trainSet: trainSet, testSet: testSet}, err
}

// Train trains the model the data calls for, a classifier or a language
// model, whose experts it calls over tr and finds through getter, showing
// progress on out.
func (j *Job) Train(ctx context.Context, out io.Writer, tr p2p.Transport, getter client.Getter) (Result, error) {
	c := j.cfg
	if d := j.data.lm; d != nil {
		fmt.Fprintf(out, "training a DMoE language model (%d blocks, k=%d, hidden %d, vocab %d, seq %d) against the swarm\n",
			len(j.grids), c.KBest, j.hidden, d.vocab, c.Seq)
		if c.Trainers > 1 {
			fmt.Fprintf(out, "one trainer: --trainers %d applies to classifiers\n", c.Trainers)
		}
		return j.trainLM(ctx, out, tr, getter, d)
	}
	fmt.Fprintf(out, "training a DMoE classifier (%d layers, k=%d, hidden %d) with %d trainer(s) against the swarm\n",
		len(j.grids), c.KBest, j.hidden, c.Trainers)
	return j.trainClassifier(ctx, out, tr, getter)
}

// layerConfig is the DMoE layers' configuration.
func (j *Job) layerConfig() client.Config {
	c := j.cfg
	return client.Config{KBest: c.KBest, KMin: c.KMin, ForwardTimeout: time.Duration(c.ForwardTimeout),
		TimeoutAfterKMin: time.Duration(c.TimeoutAfterKMin), BackwardTimeout: time.Duration(c.BackwardTimeout),
		AllowZeroOutputs: c.AllowZeroOutputs}
}

// Report prints res: as indented JSON with asJSON, else as a sentence.
func Report(w io.Writer, res Result, asJSON bool) error {
	if asJSON {
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		return enc.Encode(res)
	}
	if res.ValPerplexity > 0 {
		fmt.Fprintf(w, "validation perplexity %.1f (loss %.3f on %d tokens) after %d steps (%d failed) in %.0fs",
			res.ValPerplexity, res.ValLoss, res.EvalTokens, res.Steps, res.Failed, res.Seconds)
	} else {
		fmt.Fprintf(w, "test accuracy %.2f%% after %d steps (%d failed) in %.0fs", 100*res.TestAccuracy, res.Steps, res.Failed, res.Seconds)
	}
	if res.ExpertCalls > 0 {
		fmt.Fprintf(w, "; servers answered %d expert calls in %d batches", res.ExpertCalls, res.ExpertBatches)
	}
	fmt.Fprintln(w)
	return nil
}

// CheckFailures is the verdict on a finished run: an error when more than
// maxFailed of its steps failed, counting them and giving the first
// failure's cause once; a note on log when fewer did.
func CheckFailures(log io.Writer, res Result, maxFailed float64) error {
	if res.Failed == 0 {
		return nil
	}
	frac := float64(res.Failed) / float64(max(res.Steps, 1))
	if frac > maxFailed {
		return fmt.Errorf("%d of %d steps failed (%.0f%%, more than --max-failed-steps %g); the first failure: %w",
			res.Failed, res.Steps, 100*frac, maxFailed, res.Err)
	}
	fmt.Fprintf(log, "%d of %d steps failed (within --max-failed-steps %g); the first failure: %v\n", res.Failed, res.Steps, maxFailed, res.Err)
	return nil
}

// finish prints res on stdout (Report) and gives the verdict on its
// failed steps (CheckFailures), with notes on log.
func (j *Job) finish(stdout, log io.Writer, res Result) error {
	if err := Report(stdout, res, j.cfg.JSON); err != nil {
		return err
	}
	return CheckFailures(log, res, j.cfg.MaxFailedSteps)
}
