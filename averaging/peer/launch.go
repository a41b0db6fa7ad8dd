package peer

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/skyhive/skyhive/dht"
	"github.com/skyhive/skyhive/launch"
	"github.com/skyhive/skyhive/p2p"
	"github.com/skyhive/skyhive/swarm"
)

// LaunchConfig describes a local swarm of peer processes.
type LaunchConfig struct {
	// Exe is the skyhive executable; Peers the number of peer processes.
	Exe   string
	Peers int
	// Slowdowns gives each peer's emulated slowdown (nil: real speed).
	Slowdowns []float64
	// Peer is every peer's config (algorithm, model, duration, ...); Launch
	// sets its DHT, listen address, slowdown, stats file and MinPeers.
	Peer launch.Peer
	// Dir holds each peer's log and stats file.
	Dir string
	// Duration is how long the peers run (they stop themselves); the
	// launcher waits Duration plus a minute at most (0: until the peers
	// exit, e.g. after --steps, or ctx ends).
	Duration time.Duration
	// Log receives notices: the peers started, their progress read from
	// their stats files every ProgressEvery (5 s when 0), and their end
	// (nil: none).
	Log           io.Writer
	ProgressEvery time.Duration
	// Metrics, if set, receives the Prometheus collectors of the
	// launcher's DHT node and host (each peer process has its own
	// `--metrics`). Nil: no metrics.
	Metrics prometheus.Registerer
}

// StatsFile is where Launch has peer i write its stats.
func StatsFile(dir string, i int) string {
	return filepath.Join(dir, "peer"+strconv.Itoa(i)+"-0.stats.jsonl")
}

// Launched is the outcome of Launch.
type Launched struct {
	// DHT is the address of the launcher's DHT node.
	DHT string `json:"dht"`
	// Peers holds each peer's final result (empty if it left none).
	Peers []Result `json:"peers"`
	// MeanAccuracy averages the peers' final test accuracies.
	MeanAccuracy float64 `json:"mean_accuracy"`
	// MeanValPerplexity averages language-model peers' final validation
	// perplexities.
	MeanValPerplexity float64 `json:"mean_val_perplexity,omitempty"`
	// Algo, LM (the peers trained a language model) and Dir (their logs)
	// are set by RunLocal, for Report.
	Algo string `json:"-"`
	LM   bool   `json:"-"`
	Dir  string `json:"-"`
}

// Launch runs a DHT node in this process on loopback and Peers `skyhive
// peer` processes that join it, waits for them to finish and collects their
// results from their stats files.
func Launch(ctx context.Context, cfg LaunchConfig) (Launched, error) {
	var out Launched
	if cfg.Peers < 1 || cfg.Exe == "" || cfg.Dir == "" {
		return out, fmt.Errorf("%w: launch needs peers, an executable and a directory", ErrConfig)
	}
	if cfg.Slowdowns == nil {
		cfg.Slowdowns = slices.Repeat([]float64{1}, cfg.Peers)
	}
	if len(cfg.Slowdowns) != cfg.Peers {
		return out, fmt.Errorf("%w: %d slowdowns for %d peers", ErrConfig, len(cfg.Slowdowns), cfg.Peers)
	}
	if err := os.MkdirAll(cfg.Dir, 0o755); err != nil {
		return out, err
	}
	h, err := p2p.New(ctx, p2p.Config{ListenAddrs: []string{"/ip4/127.0.0.1/tcp/0"}, Metrics: cfg.Metrics})
	if err != nil {
		return out, err
	}
	defer h.Close()
	node, err := dht.New(h, dht.Config{PrivKey: h.LibP2P().Peerstore().PrivKey(h.ID()), Metrics: cfg.Metrics})
	if err != nil {
		return out, err
	}
	defer node.Close()
	out.DHT = fmt.Sprintf("%s/p2p/%s", h.AddrInfo().Addrs[0], h.ID())
	logf(cfg.Log, "DHT node %s; %d peer processes, logs in %s", out.DHT, cfg.Peers, cfg.Dir)
	start := time.Now()
	sw, err := startPeers(ctx, cfg, out.DHT)
	if err != nil {
		return out, err
	}
	logf(cfg.Log, "started %d peer processes, slowdowns %s; progress every %s:", cfg.Peers, formatSlowdowns(cfg.Slowdowns), cfg.progressEvery())
	wctx, cancel := ctx, context.CancelFunc(func() {})
	if cfg.Duration > 0 {
		wctx, cancel = context.WithTimeout(ctx, cfg.Duration+time.Minute)
	}
	stopProgress := watchProgress(cfg.Log, cfg.progressEvery(), start, cfg.Dir, cfg.Peers)
	werr := sw.Wait(wctx)
	stopProgress()
	cancel()
	if serr := sw.Stop(); werr == nil {
		werr = serr
	}
	logf(cfg.Log, "peer processes done after %s: %s", time.Since(start).Round(time.Second), progressLine(cfg.Dir, cfg.Peers))
	werr = errors.Join(werr, out.collect(cfg.Dir, sw.Peers()))
	if ctx.Err() != nil {
		return out, nil // interrupted: report what the peers saved
	}
	return out, werr
}

func (cfg *LaunchConfig) progressEvery() time.Duration {
	if cfg.ProgressEvery <= 0 {
		return 5 * time.Second
	}
	return cfg.ProgressEvery
}

// startPeers starts the peer processes, with the DHT node at addr.
func startPeers(ctx context.Context, cfg LaunchConfig, addr string) (*swarm.Swarm, error) {
	spec := &swarm.Spec{}
	for i, slow := range cfg.Slowdowns {
		spec.Devices = append(spec.Devices, swarm.DeviceClass{Name: "peer" + strconv.Itoa(i), Count: 1, Slowdown: slow})
	}
	pr := &swarm.Processes{
		Path: cfg.Exe, Dir: cfg.Dir,
		Config: func(p *swarm.Peer) launch.Config {
			c := cfg.Peer
			c.DHT, c.Listen = []string{addr}, []string{"/ip4/127.0.0.1/tcp/0"}
			c.Slowdown, c.Stats, c.MinPeers = p.Device.Slowdown(), StatsFile(cfg.Dir, p.Index), cfg.Peers
			return c
		},
	}
	for i := range cfg.Peers {
		os.Remove(StatsFile(cfg.Dir, i))
	}
	return swarm.Start(ctx, spec, pr, swarm.Options{StopTimeout: 30 * time.Second})
}

// collect reads the peers' final results from their stats files into out,
// with their means; a peer without one is an error that quotes its log.
func (out *Launched) collect(dir string, peers []*swarm.Peer) error {
	var errs []error
	var n int
	for _, p := range peers {
		r, err := ReadFinal(StatsFile(dir, p.Index))
		if err != nil {
			log := filepath.Join(dir, p.Name+".log")
			if t := launch.Tail(log, 3); t != "" {
				err = fmt.Errorf("%w; its log ends: %s", err, t)
			}
			errs = append(errs, fmt.Errorf("%s: %w (log: %s)", p.Name, err, log))
			continue
		}
		out.Peers = append(out.Peers, r)
		out.MeanAccuracy += r.TestAccuracy
		out.MeanValPerplexity += r.ValPerplexity
		n++
	}
	if n > 0 {
		out.MeanAccuracy /= float64(n)
		out.MeanValPerplexity /= float64(n)
	}
	return errors.Join(errs...)
}

// CopyStats appends the stats lines of the peers Launch ran in dir to w;
// a peer that never wrote any is skipped.
func CopyStats(w io.Writer, dir string, peers int) error {
	for i := range peers {
		b, err := os.ReadFile(StatsFile(dir, i))
		if errors.Is(err, os.ErrNotExist) {
			continue // the peer never got to write one
		}
		if err != nil {
			return err
		}
		if _, err := w.Write(b); err != nil {
			return err
		}
	}
	return nil
}

// ReadSnapshots returns the lines of a peer's stats file, skipping lines
// that do not parse (a peer killed mid-write leaves half a line).
func ReadSnapshots(path string) ([]Snapshot, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("no stats: %w", err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<16), 1<<22)
	var out []Snapshot
	for sc.Scan() {
		var s Snapshot
		if json.Unmarshal(sc.Bytes(), &s) == nil {
			out = append(out, s)
		}
	}
	return out, sc.Err()
}

// ReadFinal returns the final result in a peer's stats file.
func ReadFinal(path string) (Result, error) {
	snaps, err := ReadSnapshots(path)
	if err != nil {
		return Result{}, err
	}
	var last *Result
	for _, s := range snaps {
		if s.Final != nil {
			last = s.Final
		}
	}
	if last == nil {
		return Result{}, errors.New("no final result in the stats (the peer did not finish)")
	}
	return *last, nil
}
