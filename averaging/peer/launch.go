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
	// Log receives notices (nil: none).
	Log io.Writer
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
}

// Launch runs a DHT node in this process on loopback and Peers `skyhive
// peer` processes that join it, waits for them to finish and collects their
// results from their stats files.
func Launch(ctx context.Context, cfg LaunchConfig) (Launched, error) {
	var out Launched
	if cfg.Peers < 1 || cfg.Exe == "" || cfg.Dir == "" {
		return out, fmt.Errorf("%w: launch needs peers, an executable and a directory", ErrConfig)
	}
	if cfg.Slowdowns != nil && len(cfg.Slowdowns) != cfg.Peers {
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

	spec := &swarm.Spec{}
	for i := range cfg.Peers {
		slow := 1.0
		if cfg.Slowdowns != nil {
			slow = cfg.Slowdowns[i]
		}
		spec.Devices = append(spec.Devices, swarm.DeviceClass{Name: "peer" + strconv.Itoa(i), Count: 1, Slowdown: slow})
	}
	stats := func(p *swarm.Peer) string { return StatsFile(cfg.Dir, p.Index) }
	pr := &swarm.Processes{
		Path: cfg.Exe, Dir: cfg.Dir,
		Config: func(p *swarm.Peer) launch.Config {
			c := cfg.Peer
			c.DHT, c.Listen = []string{out.DHT}, []string{"/ip4/127.0.0.1/tcp/0"}
			c.Slowdown, c.Stats, c.MinPeers = p.Device.Slowdown(), stats(p), cfg.Peers
			return c
		},
	}
	for i := range cfg.Peers {
		os.Remove(StatsFile(cfg.Dir, i))
	}
	sw, err := swarm.Start(ctx, spec, pr, swarm.Options{StopTimeout: 30 * time.Second})
	if err != nil {
		return out, err
	}
	wctx, cancel := ctx, context.CancelFunc(func() {})
	if cfg.Duration > 0 {
		wctx, cancel = context.WithTimeout(ctx, cfg.Duration+time.Minute)
	}
	werr := sw.Wait(wctx)
	cancel()
	serr := sw.Stop()
	if werr == nil {
		werr = serr
	}
	var n int
	for _, p := range sw.Peers() {
		r, err := ReadFinal(stats(p))
		if err != nil {
			log := filepath.Join(cfg.Dir, p.Name+".log")
			if t := launch.Tail(log, 3); t != "" {
				err = fmt.Errorf("%w; its log ends: %s", err, t)
			}
			werr = errors.Join(werr, fmt.Errorf("%s: %w (log: %s)", p.Name, err, log))
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
	if ctx.Err() != nil {
		return out, nil // interrupted: report what the peers saved
	}
	return out, werr
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
