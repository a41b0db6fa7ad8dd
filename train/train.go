// Package train runs single-process training of a model of the registry
// (package models): the training loop with a progress bar, evaluation, and
// checkpoint save/resume. Distributed modes (pipeline, experts, averaging)
// reuse its Evaluate.
package train

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/skyhive/skyhive/checkpoint"
	"github.com/skyhive/skyhive/data"
	"github.com/skyhive/skyhive/metrics"
	"github.com/skyhive/skyhive/models"
	"github.com/skyhive/skyhive/nn"
	"github.com/skyhive/skyhive/optim"
	"github.com/skyhive/skyhive/progress"
	"github.com/skyhive/skyhive/tensor"
)

// Config configures a local training run.
type Config struct {
	Model       string  // a model spec of package models ("mlp")
	Epochs      int     // passes over the training set
	BatchSize   int     // examples per step
	LR          float64 // peak learning rate (AdamW)
	WeightDecay float64 // AdamW decoupled weight decay
	Warmup      int64   // warm-up steps of the schedule
	ClipNorm    float64 // global gradient-norm clip; 0 disables
	Seed        uint64  // seeds initialisation, dropout and shuffling
	// Checkpoint, if set, is written atomically after every epoch and when
	// the run is interrupted.
	Checkpoint string
	// Resume continues from Checkpoint if the file exists.
	Resume bool
	// Stats, if set, receives one JSON line (EpochStats) after every epoch.
	Stats io.Writer `json:"-"`
	// Input, if set, says how the features were made from raw images; the
	// checkpoint stores it so that readers can feed the model.
	Input *data.Preprocessing `json:"-"`
	// Metrics, if set, receives the skyhive_train_* metrics (steps,
	// examples, loss, test loss and accuracy after every epoch) while Run
	// runs. Nil: no metrics.
	Metrics prometheus.Registerer `json:"-"`
}

// Validate reports the first invalid field.
func (c Config) Validate() error {
	switch {
	case c.Epochs <= 0:
		return fmt.Errorf("epochs must be positive, got %d", c.Epochs)
	case c.BatchSize <= 0:
		return fmt.Errorf("batch size must be positive, got %d", c.BatchSize)
	case !(c.LR > 0) || math.IsInf(c.LR, 0):
		return fmt.Errorf("learning rate must be positive, got %v", c.LR)
	case c.WeightDecay < 0 || c.ClipNorm < 0 || c.Warmup < 0:
		return errors.New("weight decay, clip norm and warm-up must not be negative")
	case c.Resume && c.Checkpoint == "":
		return errors.New("resume needs a checkpoint path")
	}
	return nil
}

// EpochStats summarises one epoch.
type EpochStats struct {
	Epoch     int     `json:"epoch"`
	TrainLoss float64 `json:"train_loss"`
	TestLoss  float64 `json:"test_loss"`
	TestAcc   float64 `json:"test_acc"`
	Seconds   float64 `json:"seconds"`
}

// Result is the outcome of Run.
type Result struct {
	Epochs       []EpochStats `json:"epochs"`
	TestAccuracy float64      `json:"test_accuracy"`
	Seconds      float64      `json:"seconds"`
	Params       int64        `json:"params"`
	Resumed      bool         `json:"resumed"`
}

// Run trains cfg.Model on trainSet, evaluating on testSet after every epoch,
// and reports progress to out. When ctx is cancelled it saves a checkpoint
// (if configured) and returns ctx's error.
func Run(ctx context.Context, cfg Config, trainSet, testSet *data.Dataset, out io.Writer) (Result, error) {
	if err := cfg.Validate(); err != nil {
		return Result{}, err
	}
	model, err := models.Build(cfg.Model, cfg.Seed)
	if err != nil {
		return Result{}, err
	}
	params := model.Params()
	opt := optim.NewAdamW(params, optim.AdamWConfig{LR: cfg.LR, WeightDecay: cfg.WeightDecay, NoDecay: optim.NoDecayVectors})
	loader, err := data.NewLoader(trainSet, data.BatchOptions{Size: cfg.BatchSize, Shuffle: true, Seed: cfg.Seed, DropLast: true})
	if err != nil {
		return Result{}, err
	}
	steps := int64(loader.Len())
	sched := optim.Schedule{Peak: cfg.LR, Min: cfg.LR / 100, Warmup: cfg.Warmup, Total: steps * int64(cfg.Epochs), Decay: optim.Cosine}
	res := Result{Params: nn.NumParams(params)}
	tm, err := metrics.NewTraining(cfg.Metrics)
	if err != nil {
		return res, err
	}
	defer tm.Close()

	pos := position{}
	if cfg.Resume {
		if pos, err = resume(cfg, params, opt); err == nil {
			res.Resumed = true
			fmt.Fprintf(out, "resumed from %s at epoch %d, batch %d\n", cfg.Checkpoint, pos.epoch+1, pos.batch)
		} else if !errors.Is(err, os.ErrNotExist) {
			return res, err
		}
	}

	start := time.Now()
	for epoch := pos.epoch; epoch < cfg.Epochs; epoch++ {
		t0 := time.Now()
		bar := progress.New(out, fmt.Sprintf("epoch %d/%d", epoch+1, cfg.Epochs), loader.Len())
		var lossSum float64
		var seen int64
		nb := 0
		for i, b := range loader.Epoch(epoch) {
			if epoch == pos.epoch && i < pos.batch {
				continue // already trained before the checkpoint
			}
			if err := ctx.Err(); err != nil {
				return res, interrupted(cfg, model, opt, position{epoch, i}, err)
			}
			opt.SetLR(sched.LR(int64(epoch)*steps + int64(i)))
			opt.ZeroGrad()
			logits, st := model.Forward(nn.Ctx{Train: true}, b.X)
			loss, dlogits := nn.SoftmaxCrossEntropy(logits, b.Y)
			if math.IsNaN(float64(loss)) {
				return res, fmt.Errorf("epoch %d step %d: loss is NaN (try a lower learning rate)", epoch+1, i+1)
			}
			model.Backward(st, dlogits)
			if cfg.ClipNorm > 0 {
				optim.ClipGradNorm(params, cfg.ClipNorm)
			}
			opt.Step()
			tm.Step(b.Len(), float64(loss))
			lossSum += float64(loss)
			nb++
			seen += int64(b.Len())
			bar.Update(i+1, seen, progress.F("loss", lossSum/float64(nb)), progress.F("lr", opt.LR()))
		}
		pos = position{}
		testLoss, testAcc := Evaluate(model, testSet, 1000)
		tm.Eval(testLoss, testAcc)
		st := EpochStats{Epoch: epoch + 1, TrainLoss: lossSum / float64(max(nb, 1)), TestLoss: testLoss, TestAcc: testAcc, Seconds: time.Since(t0).Seconds()}
		res.Epochs = append(res.Epochs, st)
		fmt.Fprintf(out, "epoch %d: train loss %.4f, test loss %.4f, test accuracy %.2f%% (%.1fs)\n", st.Epoch, st.TrainLoss, st.TestLoss, 100*st.TestAcc, st.Seconds)
		if cfg.Stats != nil {
			if err := json.NewEncoder(cfg.Stats).Encode(st); err != nil {
				return res, fmt.Errorf("writing stats: %w", err)
			}
		}
		if cfg.Checkpoint != "" {
			if err := save(cfg, model, opt, position{epoch: epoch + 1}); err != nil {
				return res, err
			}
		}
	}
	res.Seconds = time.Since(start).Seconds()
	if len(res.Epochs) > 0 {
		res.TestAccuracy = res.Epochs[len(res.Epochs)-1].TestAcc
	} else {
		_, res.TestAccuracy = Evaluate(model, testSet, 1000)
	}
	return res, nil
}

// Evaluate returns the mean loss and the accuracy of model on ds, in
// inference mode, batch examples at a time.
func Evaluate(model nn.Module, ds *data.Dataset, batch int) (loss, acc float64) {
	n := ds.Len()
	if n == 0 {
		return 0, 0
	}
	var correct float64
	for lo := 0; lo < n; lo += batch {
		b := ds.Slice(lo, min(lo+batch, n))
		logits, _ := model.Forward(nn.Ctx{}, b.X)
		l, _ := nn.SoftmaxCrossEntropy(logits, b.Y)
		loss += float64(l) * float64(b.Len())
		correct += nn.Accuracy(logits, b.Y) * float64(b.Len())
	}
	return loss / float64(n), correct / float64(n)
}

// position is where training resumes: the next batch of an epoch.
type position struct{ epoch, batch int }

const (
	metaModel = "skyhive.model"
	metaSeed  = "skyhive.seed"
	metaEpoch = "skyhive.epoch"
	metaBatch = "skyhive.batch"
	metaStep  = "skyhive.optim_step"
	// Self-description (docs/checkpoint.md): what the model computes and
	// how its input is made, for readers without Skyhive's source.
	metaLayers = "skyhive.layers"
	metaInput  = "skyhive.input"
)

// describeMeta adds the model's layer list and, if known, its input
// preprocessing to meta.
func describeMeta(meta map[string]string, model *nn.Sequential, task string, input *data.Preprocessing) error {
	layers, err := nn.Describe(model)
	if err != nil {
		return err
	}
	b, err := json.Marshal(layers)
	if err != nil {
		return err
	}
	meta[metaTask], meta[metaLayers] = task, string(b)
	if input != nil {
		if b, err = json.Marshal(input); err != nil {
			return err
		}
		meta[metaInput] = string(b)
	}
	return nil
}

func save(cfg Config, model *nn.Sequential, opt optim.Optimizer, pos position) error {
	tensors := map[string]*tensor.Tensor{}
	for name, t := range nn.ExportParams(model.Params()) {
		tensors["model/"+name] = t
	}
	st := opt.State()
	for name, t := range st.Tensors {
		tensors["optim/"+name] = t
	}
	meta := map[string]string{
		metaModel: cfg.Model,
		metaSeed:  strconv.FormatUint(cfg.Seed, 10),
		metaEpoch: strconv.Itoa(pos.epoch),
		metaBatch: strconv.Itoa(pos.batch),
		metaStep:  strconv.FormatInt(st.Step, 10),
	}
	if err := describeMeta(meta, model, models.ImageClassification.String(), cfg.Input); err != nil {
		return fmt.Errorf("save checkpoint: %w", err)
	}
	if err := checkpoint.Save(cfg.Checkpoint, tensors, meta); err != nil {
		return fmt.Errorf("save checkpoint: %w", err)
	}
	return nil
}

func interrupted(cfg Config, model *nn.Sequential, opt optim.Optimizer, pos position, cause error) error {
	if cfg.Checkpoint == "" {
		return cause
	}
	if err := save(cfg, model, opt, pos); err != nil {
		return errors.Join(cause, err)
	}
	return fmt.Errorf("%w (checkpoint saved to %s; resume from it to continue)", cause, cfg.Checkpoint)
}

func resume(cfg Config, params []*nn.Param, opt optim.Optimizer) (position, error) {
	f, err := checkpoint.Load(cfg.Checkpoint)
	if err != nil {
		return position{}, err
	}
	if !f.Verified {
		return position{}, fmt.Errorf("checkpoint %s has no valid skyhive checksum; refusing to resume from it", cfg.Checkpoint)
	}
	if m := f.Meta[metaModel]; m != cfg.Model {
		return position{}, fmt.Errorf("checkpoint %s holds model %q, not %q", cfg.Checkpoint, m, cfg.Model)
	}
	var pos position
	var step int64
	if pos.epoch, err = strconv.Atoi(f.Meta[metaEpoch]); err == nil {
		if pos.batch, err = strconv.Atoi(f.Meta[metaBatch]); err == nil {
			step, err = strconv.ParseInt(f.Meta[metaStep], 10, 64)
		}
	}
	if err != nil || pos.epoch < 0 || pos.batch < 0 {
		return position{}, fmt.Errorf("checkpoint %s: bad position metadata: %v", cfg.Checkpoint, err)
	}
	weights := map[string]*tensor.Tensor{}
	state := optim.State{Step: step, Tensors: map[string]*tensor.Tensor{}}
	for name, t := range f.Tensors {
		if n, ok := strings.CutPrefix(name, "model/"); ok {
			weights[n] = t
		} else if n, ok := strings.CutPrefix(name, "optim/"); ok {
			state.Tensors[n] = t
		}
	}
	if err := nn.ImportParams(params, weights); err != nil {
		return position{}, fmt.Errorf("checkpoint %s: %w", cfg.Checkpoint, err)
	}
	if err := opt.LoadState(state); err != nil {
		return position{}, fmt.Errorf("checkpoint %s: %w", cfg.Checkpoint, err)
	}
	return pos, nil
}
