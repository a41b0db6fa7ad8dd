package trainer

import (
	"context"
	"fmt"
	"io"
	"math"
	"time"

	"github.com/skyhive/skyhive/jsonl"
	"github.com/skyhive/skyhive/metrics"
	"github.com/skyhive/skyhive/moe/client"
	"github.com/skyhive/skyhive/optim"
	"github.com/skyhive/skyhive/p2p"
	"github.com/skyhive/skyhive/progress"
	"github.com/skyhive/skyhive/text"
)

// lmSteps is the training length of a language model without Steps.
const lmSteps = 300

// trainLM trains a DMoE transformer language model (client.LM) whose
// blocks' feed-forward sub-blocks are the grids' experts, one trainer
// stepping at a time (client.TrainLM), then reports its validation
// perplexity.
func (j *Job) trainLM(ctx context.Context, out io.Writer, tr p2p.Transport, getter client.Getter, d *corpus) (Result, error) {
	c := j.cfg
	res := Result{Data: d.name, Vocab: d.vocab}
	steps := int64(c.Steps)
	if steps <= 0 {
		steps = lmSteps
	}
	lm, err := client.LMConfig{
		Vocab: d.vocab, Seq: c.Seq, Hidden: j.hidden, Heads: c.Heads, Grids: j.grids, CacheTTL: time.Duration(c.DHTCache), Seed: c.Seed,
		Layer: j.layerConfig(),
	}.Build(getter, tr)
	if err != nil {
		return res, err
	}
	sampler, err := text.NewSampler(d.train, c.Batch, c.Seq, c.Seed)
	if err != nil {
		return res, err
	}
	stats, closeStats, err := jsonl.Open(c.Stats)
	if err != nil {
		return res, err
	}
	defer closeStats()
	lines := jsonl.Writer{W: stats}
	opt := optim.NewAdamW(lm.Params(), optim.AdamWConfig{LR: c.LR, WeightDecay: c.WeightDecay, NoDecay: optim.NoDecayVectors})
	start := time.Now()
	st, err := client.TrainLM(ctx, lm, opt, sampler, client.LMTrainConfig{
		Steps:    steps,
		LR:       optim.Schedule{Peak: c.LR, Min: c.LR / 10, Warmup: min(c.Warmup, steps/10), Total: steps, Decay: optim.Cosine},
		ClipNorm: c.Clip,
		OnStep:   j.lmStepper(out, steps, start, &lines),
	})
	res.Steps, res.Failed, res.TrainLoss, res.Err = st.Steps, st.Failed, st.LastLoss, st.Err
	res.Seconds = time.Since(start).Seconds()
	if err != nil {
		return res, err
	}
	seq := min(c.Seq, len(d.val)-1)
	vl, err := lm.Evaluate(ctx, d.val, seq, c.Batch)
	if err != nil {
		return res, fmt.Errorf("validation: %w", err)
	}
	res.ValLoss, res.ValPerplexity = vl, math.Exp(vl)
	j.tm.Eval(vl, math.NaN())
	res.EvalTokens = (len(d.val) - 1) / seq * seq
	fmt.Fprintln(out)
	if lines.Err != nil {
		return res, fmt.Errorf("stats: %w", lines.Err)
	}
	return res, nil
}

// lmStepper returns the language model's step callback: it shows the
// progress bar, reports to the metrics and the status record, and writes
// a line of stats every tenth of the steps.
func (j *Job) lmStepper(out io.Writer, steps int64, start time.Time, lines *jsonl.Writer) func(int64, float64, error) {
	batch := j.cfg.Batch
	bar := progress.New(out, "steps", int(steps))
	tokens := int64(batch * j.cfg.Seq)
	var sum float64
	var n int64
	return func(step int64, loss float64, err error) {
		if !math.IsNaN(loss) {
			sum += loss
			n++
		}
		if err == nil {
			j.tm.Step(batch, loss)
		}
		bar.Update(int(step+1), (step+1)*tokens, progress.F("loss", sum/float64(max(n, 1))))
		j.live.Update(func(l *metrics.Status) {
			l.Step, l.Samples = step+1, (step+1)*int64(batch)
			if !math.IsNaN(loss) {
				l.Loss = metrics.Float(loss)
			}
		})
		if (step+1)%max(steps/10, 1) == 0 {
			lines.Write(Epoch{Steps: step + 1, TrainLoss: sum / float64(max(n, 1)), Seconds: time.Since(start).Seconds()})
			sum, n = 0, 0
		}
	}
}
