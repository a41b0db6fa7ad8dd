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
//
// With w.Executor "python" the layers compute in PyTorch: start starts the
// executor (bridge.StartExecutor of bridge.StageModule; nil refuses that
// executor), which the role closes; if it dies, the worker stops with
// what to do.
func RunWorkerRole(ctx context.Context, w launch.Worker, host p2p.Config, log io.Writer, start StartStageExecutor) error {
	switch {
	case len(w.DHT) > 0:
		return fmt.Errorf("%s config: %q is not an option of this role", launch.RoleWorker, "dht")
	case w.StatusEvery != 0:
		return fmt.Errorf("%s config: %q is not an option of this role", launch.RoleWorker, "status_every")
	}
	if err := checkExecutor(w.Executor, w.Python, w.Device); err != nil {
		return err
	}
	if w.Executor == ExecutorPython {
		if start == nil {
			return errors.New("this build cannot start a PyTorch executor")
		}
		return runPythonWorker(ctx, w, host, log, start)
	}
	return runWorkerRole(ctx, w, host, log, nil)
}

// checkExecutor checks a worker's executor options: python and device
// belong to the PyTorch executor. Errors are *launch.FieldErrors.
func checkExecutor(executor, python, device string) error {
	switch executor {
	case "", ExecutorGo:
		if python != "" {
			return launch.NewFieldError(nil, "%s is an option of the PyTorch executor: add --executor python", "python")
		}
		if device != "" && device != "auto" {
			return launch.NewFieldError(nil, "%s is an option of the PyTorch executor: add --executor python", "device")
		}
	case ExecutorPython:
	default:
		return launch.NewFieldError(nil, fmt.Sprintf("%%s %q: want go or python", executor), "executor")
	}
	return nil
}

// Executors of `skyhive worker --executor`.
const (
	ExecutorGo     = "go"
	ExecutorPython = "python"
)

// RoleStageExecutor is the executor of a worker role (`skyhive worker
// --executor python`): a StageExecutor that runs as a process of its own.
type RoleStageExecutor interface {
	StageExecutor
	// Done is closed when the executor has exited; Err says why.
	Done() <-chan struct{}
	Err() error
	// Torch and Device describe it: PyTorch's version, the device.
	Torch() string
	Device() string
	Close() error
}

// StartStageExecutor starts a worker's executor: the interpreter python
// (empty: $SKYHIVE_PYTHON, else python3) on device, its output to log.
type StartStageExecutor func(ctx context.Context, python, device string, log io.Writer) (RoleStageExecutor, error)

// runPythonWorker runs the worker with its layers in a PyTorch executor;
// the executor's exit stops the worker.
func runPythonWorker(ctx context.Context, w launch.Worker, host p2p.Config, log io.Writer, start StartStageExecutor) error {
	ex, err := start(ctx, w.Python, w.Device, log)
	if err != nil {
		return err
	}
	defer ex.Close()
	fmt.Fprintf(log, "pipeline worker computing in PyTorch %s on %s\n", ex.Torch(), ex.Device())
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	gone := errors.New("executor gone")
	go func() {
		select {
		case <-ex.Done():
			cancel(gone)
		case <-ctx.Done():
		}
	}()
	err = runWorkerRole(ctx, w, host, log, ex)
	if errors.Is(context.Cause(ctx), gone) {
		return fmt.Errorf("pipeline: the PyTorch executor exited (%w): start the worker again", ex.Err())
	}
	return err
}

func runWorkerRole(ctx context.Context, w launch.Worker, host p2p.Config, log io.Writer, ex StageExecutor) error {
	level := slog.LevelWarn
	if w.Verbose {
		level = slog.LevelInfo
	}
	cfg := WorkerFromLaunch(w)
	cfg.Executor = ex
	cfg.Logger = slog.New(slog.NewTextHandler(log, &slog.HandlerOptions{Level: level}))
	cfg.Host = host
	cfg.Reach = func(r p2p.Reach) { p2p.WriteReach(log, r) }
	err := RunWorkerNode(ctx, cfg, WorkerNode{MetricsAddr: w.Metrics, Log: log})
	if errors.Is(err, ErrCoordinatorAddr) {
		return launch.NewFieldError(err, "%s", "join")
	}
	return err
}
