package trainer

import (
	"context"
	"fmt"
	"io"
	"time"

	"github.com/skyhive/skyhive/data"
	"github.com/skyhive/skyhive/jsonl"
	"github.com/skyhive/skyhive/metrics"
	"github.com/skyhive/skyhive/moe/client"
	"github.com/skyhive/skyhive/optim"
	"github.com/skyhive/skyhive/p2p"
	"github.com/skyhive/skyhive/progress"
)

// classifierRun is the state of a DMoE classifier's training that its
// step and epoch callbacks share.
type classifierRun struct {
	j       *Job
	out     io.Writer
	t       *client.Trainer
	testSet *data.Dataset
	res     Result
	lines   jsonl.Writer
	bar     *progress.Bar // the current epoch's
	// The epoch and its samples at the metrics' last step.
	tmEpoch   int
	tmSamples int64
	// The finished epochs' steps and samples, for the status record
	// (under its lock).
	doneSteps, doneSamples int64
}

// trainClassifier trains a DMoE classifier on Fashion-MNIST with Trainers
// concurrent trainers (client.Trainer) that call experts over tr and find
// them through getter, showing a progress bar and evaluating after every
// epoch.
func (j *Job) trainClassifier(ctx context.Context, out io.Writer, tr p2p.Transport, getter client.Getter) (Result, error) {
	c := j.cfg
	r := &classifierRun{j: j, out: out, testSet: j.data.testSet}
	stats, closeStats, err := jsonl.Open(c.Stats)
	if err != nil {
		return r.res, err
	}
	defer closeStats()
	r.lines.W = stats
	trainSet := j.data.trainSet
	r.t, err = client.NewTrainer(ctx, client.TrainerConfig{
		Model: client.ModelConfig{Inputs: 784, Hidden: j.hidden, Classes: 10, Grids: j.grids, CacheTTL: time.Duration(c.DHTCache), Seed: c.Seed,
			Layer: j.layerConfig()},
		Connect:   func(context.Context) (p2p.Transport, client.Getter, error) { return tr, getter, nil },
		Trainers:  c.Trainers,
		Optimizer: optim.AdamWConfig{LR: c.LR, WeightDecay: c.WeightDecay},
		Train:     trainSet, Batch: c.Batch, Seed: c.Seed,
		OnStep: r.step,
	})
	if err != nil {
		return r.res, err
	}
	if r.t.EpochLen() == 0 {
		return r.res, fmt.Errorf("%d training examples hold no batch of --batch %d", trainSet.Len(), c.Batch)
	}
	if c.EvalLimit > 0 && c.EvalLimit < r.testSet.Len() {
		r.testSet = r.testSet.Slice(0, c.EvalLimit)
	}
	totalSteps := int64(c.Epochs * r.t.EpochLen())
	if c.Steps > 0 {
		totalSteps = min(totalSteps, int64(c.Steps))
	}
	r.bar = r.newBar(0)
	start := time.Now()
	err = r.t.TrainEpochs(ctx, client.EpochOptions{
		Epochs:   c.Epochs,
		MaxSteps: int64(c.Steps),
		LR:       optim.Schedule{Peak: c.LR, Min: c.LR / 20, Warmup: min(c.Warmup, totalSteps/10), Total: totalSteps, Decay: optim.Cosine},
		OnEpoch:  r.epoch,
	})
	r.res.Seconds = time.Since(start).Seconds()
	if err == nil && r.lines.Err != nil {
		err = fmt.Errorf("stats: %w", r.lines.Err)
	}
	return r.res, err
}

// newBar is the progress bar of an epoch.
func (r *classifierRun) newBar(epoch int) *progress.Bar {
	return progress.New(r.out, fmt.Sprintf("epoch %d/%d", epoch+1, r.j.cfg.Epochs), r.t.EpochLen())
}

// step reports a step: on the progress bar, to the metrics and to the
// status record.
func (r *classifierRun) step(epoch int, s client.Stats) {
	r.bar.Update(int(s.Steps), s.Samples, progress.F("loss", s.MeanLoss()), progress.F("failed", float64(s.Failed)))
	if epoch != r.tmEpoch {
		r.tmEpoch, r.tmSamples = epoch, 0
	}
	r.j.tm.Step(int(s.Samples-r.tmSamples), s.MeanLoss())
	r.tmSamples = s.Samples
	r.j.live.Update(func(l *metrics.Status) {
		l.Step, l.Samples, l.Loss = r.doneSteps+s.Steps, r.doneSamples+s.Samples, metrics.Float(s.MeanLoss())
	})
}

// epoch evaluates the model after an epoch and records the epoch: its
// failed steps, its line of stats, the result's totals.
func (r *classifierRun) epoch(ctx context.Context, epoch int, s client.Stats) error {
	if s.Failed > 0 {
		fmt.Fprintf(r.out, "\nepoch %d: %d of %d steps failed", epoch+1, s.Failed, s.Steps)
		if r.res.Err == nil {
			r.res.Err = s.Err
		}
	}
	testLoss, acc, err := r.t.Evaluate(ctx, r.testSet)
	if err != nil {
		return err
	}
	r.j.tm.Eval(testLoss, acc)
	fmt.Fprintf(r.out, "\nepoch %d: test accuracy %.2f%% (%d examples)\n", epoch+1, 100*acc, r.testSet.Len())
	r.j.live.Update(func(l *metrics.Status) {
		r.doneSteps, r.doneSamples = r.doneSteps+s.Steps, r.doneSamples+s.Samples
		l.Accuracy = metrics.Float(acc)
	})
	e := Epoch{Epoch: epoch + 1, Steps: s.Steps, Failed: s.Failed, Samples: s.Samples, TrainLoss: s.MeanLoss(),
		TestAccuracy: acc, Seconds: s.Elapsed.Seconds()}
	r.res.Epochs = append(r.res.Epochs, e)
	r.res.TestAccuracy = acc
	r.res.Steps += s.Steps
	r.res.Failed += s.Failed
	r.lines.Write(e)
	r.bar = r.newBar(epoch + 1)
	return nil
}
