// The training loop of a peer: batches, steps, evaluation and stats.

package peer

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/skyhive/skyhive/averaging/optimizer"
	"github.com/skyhive/skyhive/metrics"
	"github.com/skyhive/skyhive/nn"
	"github.com/skyhive/skyhive/optim"
	"github.com/skyhive/skyhive/progress"
	"github.com/skyhive/skyhive/swarm"
)

// trainer is the peer's training loop.
type trainer struct {
	cfg   Config
	model *nn.Sequential
	opt   *optimizer.Optimizer
	task  task
	dev   *swarm.Device
	start time.Time
	res   *Result
	// inner is the wrapped optimizer's step timer (nil: its time is not
	// counted as compute).
	inner *timedOptimizer
	// live receives the loss and evaluations for Config.Status (nil: none).
	live *liveState
	// tm receives the steps and evaluations for Config.Metrics (nil: none).
	tm *metrics.Training

	// The loop's compute accounting (its goroutine only; fill copies it
	// into the result): the start of the first step, the end of the last
	// completed one, the compute of the completed steps and the time spent
	// evaluating between the two.
	firstStep, lastStep time.Time
	compute, evalTime   time.Duration

	mu       sync.Mutex // guards res.Curve against the stats writer
	lastStat time.Time
	lastCkpt time.Time
}

func (t *trainer) loop(ctx context.Context) error {
	if t.cfg.Duration > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, t.cfg.Duration)
		defer cancel()
	}
	total := t.cfg.Steps
	if total <= 0 && t.cfg.Duration > 0 {
		total = int(t.cfg.Duration / time.Second)
	}
	var bar *progress.Bar
	if t.cfg.Progress != nil {
		bar = progress.New(t.cfg.Progress, "peer", max(total, 1))
		bar.Every = max(total/50, 1)
	}
	lastEval, lastBar := time.Now(), time.Now()
	t.lastStat, t.lastCkpt = time.Now(), time.Now()
	steps := 0
	var avg lossAverage
	var pendingEval time.Duration // evaluation time since the last step
	for t.cfg.Steps <= 0 || steps < t.cfg.Steps {
		if ctx.Err() != nil {
			return nil
		}
		t.task.next()
		t0 := time.Now()
		if t.firstStep.IsZero() {
			t.firstStep = t0
		}
		t.opt.ZeroGrad()
		loss, examples, err := t.task.grad(t.model)
		if err != nil {
			return fmt.Errorf("step %d: %w", steps+1, err)
		}
		if err := t.dev.Throttle(ctx, time.Since(t0)); err != nil {
			return nil
		}
		// The emulated device is busy from the forward pass to the end of
		// the throttle, and again in the wrapped optimizer's step inside
		// Step; Step's waiting and averaging are not compute.
		busy := time.Since(t0)
		innerBefore := t.inner.busy()
		t.opt.Inner().SetLR(learningRate(t.cfg, steps, time.Since(t.start)))
		ts := time.Now()
		if err := t.opt.Step(ctx, examples); err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
		t.lastStep = time.Now()
		t.compute += busy + t.inner.busy() - innerBefore
		t.evalTime += pendingEval
		pendingEval = 0
		t.res.MaxStepSeconds = max(t.res.MaxStepSeconds, t.lastStep.Sub(ts).Seconds())
		steps++
		t.tm.Step(examples, loss)
		smoothed := avg.add(loss)
		t.live.setLoss(smoothed)
		now := time.Now()
		if bar != nil && now.Sub(lastBar) >= time.Second {
			lastBar = now
			p := t.opt.Progress()
			done := steps
			if t.cfg.Steps <= 0 {
				done = int(now.Sub(t.start) / time.Second)
			}
			bar.Update(min(done, max(total, 1)), int64(steps*t.cfg.Batch), progress.F("loss", smoothed),
				progress.F("peers", float64(p.Peers)), progress.F("round", float64(t.opt.Round())))
		}
		if t.cfg.EvalEvery > 0 && now.Sub(lastEval) >= t.cfg.EvalEvery {
			lastEval = now
			e0 := time.Now()
			err := t.evaluate(ctx)
			// Evaluations are the measurement, not the training: their
			// time between the first and the last step is left out of
			// TrainSeconds (counted once a step follows).
			pendingEval += time.Since(e0)
			if err != nil {
				if ctx.Err() != nil {
					return nil // stopped: Run evaluates once more
				}
				return err
			}
		}
		if now.Sub(t.lastStat) >= t.cfg.StatsEvery {
			t.lastStat = now
			t.writeStats(false)
		}
		if t.cfg.Checkpoint != "" && now.Sub(t.lastCkpt) >= t.cfg.CheckpointEvery {
			t.lastCkpt = now
			if err := t.save(); err != nil {
				return err
			}
		}
	}
	return nil
}

// waitNotice tells a peer's user how the wait for the run's peers goes, as
// one line whenever the count changes and at most every waitNoticeEvery
// otherwise, so that the minutes before the first step are not silent.
type waitNotice struct {
	w     io.Writer // nil: nothing is written
	start time.Time
	at    time.Time // of the last line
	last  int
}

// waitNoticeEvery is how often an unchanged wait is reported.
const waitNoticeEvery = 5 * time.Second

func newWaitNotice(w io.Writer) *waitNotice {
	return &waitNotice{w: w, start: time.Now(), last: -1}
}

// update reports that have of the want peers of run are there.
func (n *waitNotice) update(run string, have, want int) {
	if n.w == nil || (have == n.last && time.Since(n.at) < waitNoticeEvery) {
		return
	}
	n.last, n.at = have, time.Now()
	fmt.Fprintf(n.w, "waiting for the peers of run %q: %d of %d here after %v\n", run, have, want, time.Since(n.start).Round(time.Second))
}

// lossDecay is the weight of the past in the progress line's loss.
const lossDecay = 0.98

// lossAverage is the exponential moving average of the loss that the
// progress line and the status record show, divided by 1 - lossDecay^n
// after n losses (as Adam corrects its moments), so that it is the loss's
// level from the first step on instead of rising from 0 towards it.
type lossAverage struct {
	ema float64
	n   int
}

// add takes one step's loss and returns the corrected average.
func (a *lossAverage) add(loss float64) float64 {
	a.n++
	a.ema = lossDecay*a.ema + (1-lossDecay)*loss
	return a.ema / (1 - math.Pow(lossDecay, float64(a.n)))
}

// learningRate is the learning rate of the step after steps local steps,
// elapsed into the run: a linear warm-up over cfg.Warmup steps, then a
// cosine decay from LR to LR/10 over Steps or Duration when the run's
// length is known.
func learningRate(cfg Config, steps int, elapsed time.Duration) float64 {
	if steps < cfg.Warmup {
		return cfg.LR * float64(steps+1) / float64(cfg.Warmup)
	}
	frac := -1.0
	switch {
	case cfg.Steps > 0:
		frac = float64(steps) / float64(cfg.Steps)
	case cfg.Duration > 0:
		frac = elapsed.Seconds() / cfg.Duration.Seconds()
	}
	if frac < 0 {
		return cfg.LR
	}
	frac = min(frac, 1)
	return cfg.LR * (0.1 + 0.9*0.5*(1+math.Cos(math.Pi*frac)))
}

// evaluate measures the model (with averages that arrived) on the held-out
// data: the test set of an image model, the validation tokens of a
// language model.
//
// With a progress bar it says when it starts and how long it took, so that
// an evaluation of many seconds, after the bar's 100% or between its
// updates, does not look like a hang.
func (t *trainer) evaluate(ctx context.Context) error {
	nn.SetFlatValues(t.model.Params(), t.opt.Consensus())
	e := Eval{Steps: t.opt.Stats().Steps}
	e0 := time.Now()
	if w := t.cfg.Progress; w != nil {
		fmt.Fprintf(w, "\nevaluating after %d steps …\n", e.Steps)
	}
	if err := t.task.eval(ctx, t.model, &e); err != nil {
		return fmt.Errorf("evaluate: %w", err)
	}
	if w := t.cfg.Progress; w != nil {
		fmt.Fprintf(w, "evaluated in %v\n", time.Since(e0).Round(100*time.Millisecond))
	}
	e.Unix, e.Seconds = float64(time.Now().UnixNano())/1e9, time.Since(t.start).Seconds()
	t.mu.Lock()
	defer t.mu.Unlock()
	t.res.Curve = append(t.res.Curve, e)
	t.live.setEval(e)
	if t.cfg.lm() {
		t.tm.Eval(e.Loss, math.NaN())
	} else {
		t.tm.Eval(e.Loss, e.Accuracy)
	}
	if len(t.res.Curve) == 1 {
		t.res.FirstAccuracy, t.res.FirstPerplexity = e.Accuracy, e.Perplexity
	}
	return nil
}

// fill copies the final counters into the result.
func (t *trainer) fill() {
	s := t.opt.Stats()
	p := t.opt.Progress()
	r := t.res
	r.ComputeSeconds = t.compute.Seconds()
	r.EvalSeconds = t.evalTime.Seconds()
	if !t.lastStep.IsZero() {
		r.TrainStartUnix = float64(t.firstStep.UnixNano()) / 1e9
		r.TrainSeconds = (t.lastStep.Sub(t.firstStep) - t.evalTime).Seconds()
	}
	r.Steps, r.Rounds, r.Samples = s.Steps, s.Round, s.Samples
	r.BytesSent, r.BytesReceived = s.BytesSent, s.BytesReceived
	r.Groups, r.Failures, r.Rejected = s.Groups+s.GlobalSyncs, s.Failures, s.Rejected
	r.Epoch, r.SwarmPeers = p.Epoch, p.Peers
	r.Seconds = time.Since(t.start).Seconds()
	if n := len(r.Curve); n > 0 {
		last := r.Curve[n-1]
		if t.cfg.lm() {
			r.ValLoss, r.ValPerplexity = last.Loss, last.Perplexity
		} else {
			r.TestAccuracy, r.TestLoss = last.Accuracy, last.Loss
		}
	}
}

// writeStats writes a stats line.
func (t *trainer) writeStats(final bool) {
	if t.cfg.Stats == nil {
		return
	}
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	t.mu.Lock()
	snap := Snapshot{
		Time: time.Now().UTC().Format(time.RFC3339), Peer: t.res.Peer, Seconds: time.Since(t.start).Seconds(),
		Stats: t.opt.Stats(), Progress: t.opt.Progress(),
		Goroutines: runtime.NumGoroutine(), RSSBytes: rss(), HeapBytes: ms.HeapInuse,
	}
	if n := len(t.res.Curve); n > 0 {
		snap.Accuracy, snap.Perplexity = t.res.Curve[n-1].Accuracy, t.res.Curve[n-1].Perplexity
	}
	if final {
		r := *t.res
		r.Curve = slices.Clone(r.Curve)
		snap.Final = &r
	}
	t.mu.Unlock()
	b, err := json.Marshal(snap)
	if err == nil {
		t.cfg.Stats.Write(append(b, '\n'))
	}
}

// rss is the process's resident memory from /proc (0 where unavailable).
func rss() int64 {
	b, err := os.ReadFile("/proc/self/statm")
	if err != nil {
		return 0
	}
	f := strings.Fields(string(b))
	if len(f) < 2 {
		return 0
	}
	pages, _ := strconv.ParseInt(f[1], 10, 64)
	return pages * int64(os.Getpagesize())
}

// timedOptimizer counts the time the wrapped optimizer spends in Step:
// the local update is compute, whichever averaging algorithm calls it.
type timedOptimizer struct {
	optim.Optimizer
	nanos atomic.Int64
}

// Step runs the wrapped Step and adds its duration.
func (o *timedOptimizer) Step() {
	t0 := time.Now()
	o.Optimizer.Step()
	o.nanos.Add(int64(time.Since(t0)))
}

// busy is the time spent in Step so far (0 for a nil o).
func (o *timedOptimizer) busy() time.Duration {
	if o == nil {
		return 0
	}
	return time.Duration(o.nanos.Load())
}
