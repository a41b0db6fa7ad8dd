package peer

import (
	"context"
	"encoding/json"
	"math"
	"sync"
	"testing"
	"time"

	libp2ppeer "github.com/libp2p/go-libp2p/core/peer"

	"github.com/skyhive/skyhive/averaging/optimizer"
	"github.com/skyhive/skyhive/clock"
	"github.com/skyhive/skyhive/data"
	"github.com/skyhive/skyhive/optim"
	"github.com/skyhive/skyhive/swarm"
)

// sleepRecorder is the wall clock, adding up the time it is asked to
// sleep: the emulated slowdown's share of a peer's compute.
type sleepRecorder struct {
	clock.Clock
	mu    sync.Mutex
	slept time.Duration
}

func (c *sleepRecorder) Sleep(ctx context.Context, d time.Duration) error {
	c.mu.Lock()
	c.slept += d
	c.mu.Unlock()
	return c.Clock.Sleep(ctx, d)
}

// TestComputeSecondsCountsSlowdownAndStaysWithinTrainingTime: a peer alone
// (local SGD, nothing to wait for) with a device three times slower than
// this machine reports compute seconds that include the slowdown's sleep
// and its real compute (at least 3/2 of the sleep, since the sleep is
// twice the compute it stretches), fit in its training time, and fill
// most of it; the training time and its start are consistent with the
// run's length.
func TestComputeSecondsCountsSlowdownAndStaysWithinTrainingTime(t *testing.T) {
	if _, err := data.LoadFashionMNIST("", data.Test, data.LoadOptions{Limit: 1}); err != nil {
		t.Skipf("Fashion-MNIST not installed: %v", err)
	}
	const slowdown = 3
	clk := &sleepRecorder{Clock: clock.Real()}
	dev, err := swarm.NewDevice("slow", slowdown, 0, swarm.WithClock(clk))
	if err != nil {
		t.Fatal(err)
	}
	cfg := Config{
		DHT: []libp2ppeer.AddrInfo{startDHT(t)}, JoinTimeout: 20 * time.Second, RunID: "compute-seconds",
		Algo: optimizer.Local, GroupSize: 2, MinPeers: 1, WaitPeers: 20 * time.Second, RoundInterval: 200 * time.Millisecond,
		Limit: 2000, EvalExamples: 500, Batch: 32, Steps: 60, EvalEvery: time.Millisecond, Device: dev,
	}
	cfg.Host.ListenAddrs = []string{"/ip4/127.0.0.1/tcp/0"}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	before := time.Now()
	res, err := Run(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	slept := clk.slept.Seconds()
	t.Logf("compute %.3fs (slept %.3fs), training %.3fs, evaluating %.3fs, run %.3fs, %d steps",
		res.ComputeSeconds, slept, res.TrainSeconds, res.EvalSeconds, res.Seconds, res.Steps)
	if res.Steps != cfg.Steps {
		t.Fatalf("%d steps, want %d", res.Steps, cfg.Steps)
	}
	if slept <= 0 {
		t.Fatal("the device never slept: the slowdown was not emulated")
	}
	if res.ComputeSeconds < slept*slowdown/(slowdown-1) {
		t.Errorf("compute %.3fs < %.3fs: the slowdown's sleep and the compute it stretches are not both counted", res.ComputeSeconds, slept*slowdown/(slowdown-1))
	}
	if res.ComputeSeconds > res.TrainSeconds {
		t.Errorf("compute %.3fs exceeds the training time %.3fs", res.ComputeSeconds, res.TrainSeconds)
	}
	// Alone, the peer does little but compute: batches, bookkeeping and
	// (on a loaded machine) scheduling are the rest.
	if u := res.ComputeSeconds / res.TrainSeconds; u < 0.6 {
		t.Errorf("utilization %.2f of a peer with nothing to wait for", u)
	}
	// Evaluations after every step were left out of the training time.
	if res.EvalSeconds <= 0 || len(res.Curve) < cfg.Steps/2 {
		t.Errorf("%.3fs evaluating in %d evaluations", res.EvalSeconds, len(res.Curve))
	}
	if res.TrainSeconds+res.EvalSeconds > res.Seconds {
		t.Errorf("training %.3fs + evaluating %.3fs exceed the run's %.3fs", res.TrainSeconds, res.EvalSeconds, res.Seconds)
	}
	start := time.Unix(0, int64(res.TrainStartUnix*1e9))
	if start.Before(before) || start.After(time.Now()) {
		t.Errorf("training started at %v, outside the run (%v to now)", start, before)
	}
	// The benchmark line carries the fields under their JSON names.
	b, err := json.Marshal(res)
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"compute_seconds", "train_seconds", "eval_seconds", "train_start_unix"} {
		if v, ok := m[k].(float64); !ok || !(v > 0) || math.IsInf(v, 0) {
			t.Errorf("%s = %v in %s", k, m[k], b)
		}
	}
}

// TestTimedOptimizerCountsStep: the wrapper adds the wrapped Step's time
// and forwards everything else.
func TestTimedOptimizerCountsStep(t *testing.T) {
	inner := &slowStep{Optimizer: optim.NewSGD(nil, optim.SGDConfig{LR: 0.1}), d: 20 * time.Millisecond}
	o := &timedOptimizer{Optimizer: inner}
	o.Step()
	o.Step()
	if got := o.busy(); got < 40*time.Millisecond || got > 2*time.Second {
		t.Errorf("busy %v after two 20 ms steps", got)
	}
	if inner.steps != 2 {
		t.Errorf("%d wrapped steps, want 2", inner.steps)
	}
	o.SetLR(0.5)
	if o.LR() != 0.5 || inner.LR() != 0.5 {
		t.Errorf("SetLR not forwarded: %v, %v", o.LR(), inner.LR())
	}
	var none *timedOptimizer
	if none.busy() != 0 {
		t.Error("a nil timer is busy")
	}
}

type slowStep struct {
	optim.Optimizer
	d     time.Duration
	steps int
}

func (s *slowStep) Step() {
	time.Sleep(s.d)
	s.steps++
}
