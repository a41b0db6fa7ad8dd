// The training loop of a peer: batches, steps, evaluation and stats.

package peer

import (
	"context"
	"encoding/json"
	"math"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/skyhive/skyhive/averaging/optimizer"
	"github.com/skyhive/skyhive/data"
	"github.com/skyhive/skyhive/nn"
	"github.com/skyhive/skyhive/progress"
	"github.com/skyhive/skyhive/swarm"
	"github.com/skyhive/skyhive/train"
)

// trainer is the peer's training loop.
type trainer struct {
	cfg    Config
	model  *nn.Sequential
	opt    *optimizer.Optimizer
	loader *data.Loader
	train  *data.Dataset
	test   *data.Dataset
	dev    *swarm.Device
	start  time.Time
	res    *Result

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
	var order []int
	epoch, steps := 0, 0
	var ema float64
	for t.cfg.Steps <= 0 || steps < t.cfg.Steps {
		if ctx.Err() != nil {
			return nil
		}
		if len(order) < t.cfg.Batch {
			order = t.loader.Order(epoch)
			epoch++
		}
		b := t.train.Gather(order[:t.cfg.Batch])
		order = order[t.cfg.Batch:]
		t0 := time.Now()
		t.opt.ZeroGrad()
		logits, st := t.model.Forward(nn.Ctx{Train: true}, b.X)
		loss, dlogits := nn.SoftmaxCrossEntropy(logits, b.Y)
		t.model.Backward(st, dlogits)
		if err := t.dev.Throttle(ctx, time.Since(t0)); err != nil {
			return nil
		}
		t.opt.Inner().SetLR(t.lr(steps, time.Since(t.start)))
		ts := time.Now()
		if err := t.opt.Step(ctx, t.cfg.Batch); err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
		t.res.MaxStepSeconds = max(t.res.MaxStepSeconds, time.Since(ts).Seconds())
		steps++
		ema = 0.98*ema + 0.02*float64(loss)
		now := time.Now()
		if bar != nil && now.Sub(lastBar) >= time.Second {
			lastBar = now
			p := t.opt.Progress()
			done := steps
			if t.cfg.Steps <= 0 {
				done = int(now.Sub(t.start) / time.Second)
			}
			bar.Update(min(done, max(total, 1)), int64(steps*t.cfg.Batch), progress.F("loss", ema),
				progress.F("peers", float64(p.Peers)), progress.F("round", float64(t.opt.Round())))
		}
		if t.cfg.EvalEvery > 0 && now.Sub(lastEval) >= t.cfg.EvalEvery {
			lastEval = now
			t.evaluate()
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

// lr is the learning rate at this point of the run: cosine decay from LR
// to LR/10 over Steps or Duration when the run's length is known.
func (t *trainer) lr(steps int, elapsed time.Duration) float64 {
	frac := -1.0
	switch {
	case t.cfg.Steps > 0:
		frac = float64(steps) / float64(t.cfg.Steps)
	case t.cfg.Duration > 0:
		frac = elapsed.Seconds() / t.cfg.Duration.Seconds()
	}
	if frac < 0 {
		return t.cfg.LR
	}
	frac = min(frac, 1)
	return t.cfg.LR * (0.1 + 0.9*0.5*(1+math.Cos(math.Pi*frac)))
}

// evaluate measures the model (with averages that arrived) on the test set.
func (t *trainer) evaluate() {
	nn.SetFlatValues(t.model.Params(), t.opt.Snapshot())
	loss, acc := train.Evaluate(t.model, t.test, 500)
	t.mu.Lock()
	defer t.mu.Unlock()
	t.res.Curve = append(t.res.Curve, Eval{Unix: float64(time.Now().UnixNano()) / 1e9, Seconds: time.Since(t.start).Seconds(), Steps: t.opt.Stats().Steps, Accuracy: acc, Loss: loss})
	if len(t.res.Curve) == 1 {
		t.res.FirstAccuracy = acc
	}
}

// fill copies the final counters into the result.
func (t *trainer) fill() {
	s := t.opt.Stats()
	p := t.opt.Progress()
	r := t.res
	r.Steps, r.Rounds, r.Samples = s.Steps, s.Round, s.Samples
	r.BytesSent, r.BytesReceived = s.BytesSent, s.BytesReceived
	r.Groups, r.Failures = s.Groups+s.GlobalSyncs, s.Failures
	r.Epoch, r.SwarmPeers = p.Epoch, p.Peers
	r.Seconds = time.Since(t.start).Seconds()
	if n := len(r.Curve); n > 0 {
		r.TestAccuracy, r.TestLoss = r.Curve[n-1].Accuracy, r.Curve[n-1].Loss
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
		snap.Accuracy = t.res.Curve[n-1].Accuracy
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
