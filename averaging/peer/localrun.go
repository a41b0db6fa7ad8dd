package peer

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/skyhive/skyhive/averaging/optimizer"
	"github.com/skyhive/skyhive/averaging/sim"
	"github.com/skyhive/skyhive/jsonl"
	"github.com/skyhive/skyhive/launch"
	"github.com/skyhive/skyhive/metrics"
	"github.com/skyhive/skyhive/models"
	"github.com/skyhive/skyhive/train"
)

// MaxLocalPeers bounds the peer processes of a LocalRun.
const MaxLocalPeers = 64

// LocalRun describes a swarm of `skyhive peer` processes on this machine
// (`skyhive train averaging`, `skyhive demo averaging`): Peers peers with
// emulated slowdowns drawn from U[SlowdownMin, SlowdownMax] that train
// with the same config. RunLocal's errors for a run that cannot start
// wrap ErrConfig and name the flags of those commands.
type LocalRun struct {
	// Exe is the skyhive executable the peers run.
	Exe   string
	Peers int
	// SlowdownMin and SlowdownMax bound the slowdowns, drawn with
	// Peer.Seed.
	SlowdownMin, SlowdownMax float64
	// Peer is every peer's config. The peers stop after Peer.Steps or
	// Peer.Duration, whichever comes first (0: no bound; one must be
	// given). RunLocal runs them quiet, writing stats every 5 s, and
	// evaluating four times in a Duration. Its DHT, listen address,
	// slowdown, stats file and MinPeers are set by Launch.
	Peer launch.Peer
	// Dir holds the peers' logs and stats files ("": a new temporary
	// directory).
	Dir string
	// Log receives the notices and the progress lines (nil: none).
	Log io.Writer
	// Out receives the peers' results when they are done: indented JSON
	// with JSON, else the sentences of Launched.Report (nil: none).
	Out  io.Writer
	JSON bool
	// Stats names a file the peers' stats lines are appended to when
	// they are done ("": none).
	Stats string
	// Metrics, if set, is the address (host:port) on which the launcher's
	// DHT node and host serve their Prometheus metrics while the run lasts.
	Metrics string
}

// Check refuses a run that cannot start, naming the options; RunLocal
// checks too.
func (r *LocalRun) Check() error {
	p := r.Peer
	if _, err := optimizer.ParseAlgo(p.Algo); err != nil {
		return optionErr(err, "%s", "algo")
	}
	if err := CheckOuter(p.Algo, p.InnerSteps, p.WarmupInnerSteps, p.Fragments, p.OverlapSteps, p.OuterLR); err != nil {
		return err
	}
	switch {
	case r.Peers < 1 || r.Peers > MaxLocalPeers:
		return optionErr(nil, fmt.Sprintf("%%s must be in 1..%d, got %d", MaxLocalPeers, r.Peers), "peers")
	case r.SlowdownMin < 1 || r.SlowdownMax < r.SlowdownMin:
		return optionErr(nil, fmt.Sprintf("%%s and %%s must satisfy 1 <= min <= max, got %v..%v", r.SlowdownMin, r.SlowdownMax), "slowdown_min", "slowdown_max")
	case p.Duration < 0 || p.Steps < 0:
		return optionErr(nil, "%s and %s must not be negative", "duration", "steps")
	case p.Duration == 0 && p.Steps == 0:
		return optionErr(nil, "give the peers a %s or a number of %s", "duration", "steps")
	case p.Limit < 0:
		return optionErr(nil, fmt.Sprintf("%%s must not be negative, got %d", p.Limit), "limit")
	}
	return nil
}

// Resolve settles the peers' options as a command's flags give them
// (given says which, by launch.Peer field name; see peer.Resolve): with
// Steps but no Duration given, the peers run for Steps alone; a language
// model takes no image options and its model's batch and learning rate
// unless they are given (models.ApplyDefaults). The errors are
// *launch.FieldError where they concern options.
func (r *LocalRun) Resolve(given func(field string) bool) error {
	c := &r.Peer
	if err := Resolve(c, given); err != nil {
		return err
	}
	if c.Steps > 0 && !given("duration") {
		c.Duration = 0
	}
	if train.IsLanguageModel(c.Model) {
		c.Momentum, c.DataDir, c.Limit = 0, "", 0
		d := models.ApplyDefaults(c.Model, given, models.TrainDefaults{Batch: c.Batch, LR: c.LR})
		c.Batch, c.LR = d.Batch, d.LR
	}
	return nil
}

// RunLocal starts the run's peers on this machine, reports on Log what
// it runs, the peers' progress while they train and their end, and
// returns their results (Launched, with the run's algorithm and directory
// for Report), which it writes on Out and whose stats lines it appends to
// Stats. Errors in Stats and Metrics are *launch.FieldError.
func RunLocal(ctx context.Context, r LocalRun) (Launched, error) {
	if err := r.Check(); err != nil {
		return Launched{}, err
	}
	log := r.Log
	if log == nil {
		log = io.Discard
	}
	reg, stopMetrics, err := metrics.Start(ctx, r.Metrics, log)
	if err != nil {
		return Launched{}, &launch.FieldError{Fields: []string{"metrics"}, Text: "%s", Err: err}
	}
	defer stopMetrics()
	if r.Dir == "" {
		dir, err := os.MkdirTemp("", "skyhive-averaging-")
		if err != nil {
			return Launched{}, err
		}
		r.Dir = dir
	}
	c := r.Peer
	c.Quiet, c.StatsEvery = true, launch.Duration(5*time.Second)
	if c.OuterMomentum == 0 {
		c.OuterMomentum = optimizer.NoMomentum // a zero would be left out of the config, taking the default
	}
	if c.Duration > 0 {
		c.EvalEvery = c.Duration / 4
	}
	lm := train.IsLanguageModel(c.Model)
	logf(r.Log, "%s with %d peer processes (slowdowns %.1f..%.1f), %s, %s; logs in %s",
		c.Algo, r.Peers, r.SlowdownMin, r.SlowdownMax, r.describe(lm), r.length(), r.Dir)
	res, err := Launch(ctx, LaunchConfig{
		Exe: r.Exe, Peers: r.Peers, Slowdowns: sim.DrawSlowdowns(r.Peers, r.SlowdownMin, r.SlowdownMax, c.Seed),
		Peer: c, Dir: r.Dir, Duration: time.Duration(c.Duration), Log: r.Log, Metrics: reg.Registerer(),
	})
	res.Algo, res.LM, res.Dir = c.Algo, lm, r.Dir
	if serr := r.appendStats(); serr != nil && err == nil {
		err = serr
	}
	if werr := res.write(r.Out, r.JSON); werr != nil {
		return res, werr
	}
	return res, err
}

// appendStats appends the peers' stats lines to the file Stats names.
func (r *LocalRun) appendStats() error {
	w, closeStats, err := jsonl.Open(r.Stats)
	if err == nil && w != nil {
		err = CopyStats(w, r.Dir, r.Peers)
		closeStats()
	}
	if err != nil {
		return &launch.FieldError{Fields: []string{"stats"}, Text: "%s", Err: err}
	}
	return nil
}

// write writes the results on w (nil: nowhere): indented JSON with
// asJSON, else Report's sentences.
func (l Launched) write(w io.Writer, asJSON bool) error {
	switch {
	case w == nil:
	case asJSON:
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		return enc.Encode(l)
	default:
		l.Report(w)
	}
	return nil
}

// describe names the run's model and, for a language model, its data.
func (r *LocalRun) describe(lm bool) string {
	if !lm {
		return r.Peer.Model
	}
	return r.Peer.Model + " on " + r.Peer.Data
}

// length describes how long the peers train.
func (r *LocalRun) length() string {
	d := time.Duration(r.Peer.Duration)
	if r.Peer.Steps == 0 {
		return d.String()
	}
	s := fmt.Sprintf("%d steps", r.Peer.Steps)
	if d > 0 {
		s += " or " + d.String()
	}
	return s
}
