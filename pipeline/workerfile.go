package pipeline

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"time"

	"github.com/skyhive/skyhive/launch"
	"github.com/skyhive/skyhive/node"
	"github.com/skyhive/skyhive/p2p"
)

// WorkerFromLaunch is the WorkerConfig of a worker launched with a typed
// config (what swarm.LaunchPipelineWorkers writes for each child): its
// coordinator, name, emulated speed, region, memory cap and listen
// addresses.
func WorkerFromLaunch(w launch.Worker) WorkerConfig {
	cfg := WorkerConfig{Join: w.Join, Name: w.Name, Slowdown: w.Slowdown, Steady: w.Steady,
		Region: w.Region, MemCap: w.MemCap, Heartbeat: time.Duration(w.Heartbeat),
		Host: p2p.Config{ListenAddrs: w.Listen}}
	if len(cfg.Host.ListenAddrs) == 0 {
		cfg.Host.ListenAddrs = []string{"/ip4/127.0.0.1/tcp/0"}
	}
	return cfg
}

// RunWorkerFile runs the worker described by the launch file at path (the
// argument "@path" a launched child gets) until the coordinator shuts it
// down or ctx ends. Test programs that stand in for the skyhive binary use
// it to serve as launched workers.
func RunWorkerFile(ctx context.Context, path string) error {
	f, err := launch.Read(path)
	if err != nil {
		return err
	}
	var w launch.Worker
	if err := f.Decode(&w); err != nil {
		return fmt.Errorf("pipeline: worker file %s: %w", path, err)
	}
	return RunWorker(ctx, WorkerFromLaunch(w))
}

// WorkerNode is what a worker process's node adds to its WorkerConfig.
type WorkerNode struct {
	// MetricsAddr, if set, serves the node's Prometheus metrics, the
	// worker's included, on http://MetricsAddr/metrics.
	MetricsAddr string
	// Log receives the node's notices (where its metrics are served).
	Log io.Writer
}

// NodeConfig is the config of the node a worker process runs on: the host
// the worker would start itself (cfg.Host with the worker's message
// limits), reporting where others reach it to cfg.Reach, no DHT, and the
// metrics endpoint of wn.
func (cfg WorkerConfig) NodeConfig(wn WorkerNode) node.Config {
	cfg.setDefaults()
	hcfg := cfg.hostConfig()
	return node.Config{Host: &hcfg, DHT: node.DHTConfig{Mode: node.DHTOff}, MetricsAddr: wn.MetricsAddr,
		OnReach: cfg.Reach, Log: wn.Log}
}

// RunWorkerNode runs a worker process's role: a worker on a node of its
// own (cfg.NodeConfig(wn)) until it stops, then the node closes. An
// address in cfg.Join that is no coordinator's fails before the node
// starts.
func RunWorkerNode(ctx context.Context, cfg WorkerConfig, wn WorkerNode) error {
	if _, err := cfg.check(); err != nil {
		return err
	}
	n, err := node.New(ctx, cfg.NodeConfig(wn))
	if err != nil {
		return err
	}
	err = RunWorkerOn(ctx, n, cfg)
	return errors.Join(err, n.Close())
}

// RunWorkerOn runs a worker on n's host, reporting to n's metrics
// registerer, until it stops; n stays open.
func RunWorkerOn(ctx context.Context, n *node.Node, cfg WorkerConfig) error {
	cfg.Transport, cfg.Metrics, cfg.Reach = n.Host(), n.Metrics(), nil
	return RunWorker(ctx, cfg)
}

// RunWorkerRole runs a worker process's role, the worker w describes, on
// a node of its own (RunWorkerNode) with the host config host (w.Net's),
// until the coordinator shuts it down, it loses the coordinator, or ctx
// ends. Its warnings (with w.Verbose its stage assignments and joins too),
// its reachability and its notices go to log. A worker has no DHT and no
// status record, which only a config file could give it; a bad coordinator
// address is a *launch.FieldError.
func RunWorkerRole(ctx context.Context, w launch.Worker, host p2p.Config, log io.Writer) error {
	switch {
	case len(w.DHT) > 0:
		return fmt.Errorf("%s config: %q is not an option of this role", launch.RoleWorker, "dht")
	case w.StatusEvery != 0:
		return fmt.Errorf("%s config: %q is not an option of this role", launch.RoleWorker, "status_every")
	}
	level := slog.LevelWarn
	if w.Verbose {
		level = slog.LevelInfo
	}
	cfg := WorkerFromLaunch(w)
	cfg.Logger = slog.New(slog.NewTextHandler(log, &slog.HandlerOptions{Level: level}))
	cfg.Host = host
	cfg.Reach = func(r p2p.Reach) { p2p.WriteReach(log, r) }
	err := RunWorkerNode(ctx, cfg, WorkerNode{MetricsAddr: w.Metrics, Log: log})
	if errors.Is(err, ErrCoordinatorAddr) {
		return launch.NewFieldError(err, "%s", "join")
	}
	return err
}
