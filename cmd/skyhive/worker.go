package main

import (
	"context"
	"io"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/skyhive/skyhive/bridge"
	"github.com/skyhive/skyhive/launch"
	"github.com/skyhive/skyhive/pipeline"
)

func newWorkerCmd() *cobra.Command {
	var f workerFlags
	cmd := &cobra.Command{
		Use:   "worker --join ADDR",
		Short: "Serve as a pipeline stage worker for a coordinator (skyhive train pipeline)",
		Long: "Join a pipeline coordinator and serve whatever block of layers it assigns: run forward and\n" +
			"backward passes of micro-batches, exchange activations and gradients directly with the\n" +
			"neighbouring stages, step the stage's optimizer, and hand the layers over when the\n" +
			"coordinator re-plans. The worker exits when the coordinator shuts it down or stops\n" +
			"answering heartbeats.\n\n" +
			"--slowdown F emulates a device F times slower (after each op it sleeps (F-1)x the op's busy time: its CPU time, or while it waits for helper threads, its wall time less waits for a core);\n" +
			"--steady makes that busy time the median of the op's recent executions (a device of steady speed);\n" +
			"--mem-cap refuses stages needing more memory than BYTES.\n\n" +
			"--executor python computes the layers in PyTorch instead of Go: the worker starts\n" +
			"python3 -m skyhive.executor (--python; the skyhive package of python/ on its path) on --device,\n" +
			"which holds the PyTorch twins of the model's layers (skyhive.stages) and their optimizer;\n" +
			"the coordinator plans, moves and checkpoints them as it does Go layers.",
		Example: "  skyhive worker --join /ip4/10.0.0.1/tcp/4001/p2p/12D3KooW... --listen /ip4/0.0.0.0/tcp/0\n" +
			"  skyhive worker --join $COORD --slowdown 2.5 --mem-cap 2000000000\n" +
			"  PYTHONPATH=python skyhive worker --join $COORD --executor python --device cuda",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return runWorkerRole(cmd.Context(), cmd.OutOrStdout(), cmd.ErrOrStderr(), f.config())
		},
	}
	f.register(cmd.Flags())
	cmd.MarkFlagRequired("join")
	return cmd
}

// workerFlags are the options of `skyhive worker`: a launch.Worker.
type workerFlags struct {
	w       launch.Worker
	net     connectFlags
	metrics metricsFlags
}

// register adds the flags of `skyhive worker`, with their defaults
// (pipeline.WorkerDefaults).
func (f *workerFlags) register(fl *pflag.FlagSet) {
	f.w = pipeline.WorkerDefaults()
	w := &f.w
	fl.StringVar(&w.Join, "join", "", "coordinator multiaddr ending in /p2p/<peer id> (required)")
	fl.StringVar(&w.Name, "name", "", "name shown in the coordinator's tables (default: peer ID)")
	f.net.register(fl, "")
	fl.Float64Var(&w.Slowdown, "slowdown", w.Slowdown, "emulated slowdown factor (>= 1)")
	fl.BoolVar(&w.Steady, "steady", false, "emulate a steady device: --slowdown multiplies the median busy time of each op's recent executions, not this one's, so the host's second-to-second noise does not reach the emulated speed")
	fl.StringVar(&w.Region, "region", "", "network region of this worker (plans group stages by region; required by coordinators that emulate links)")
	fl.Int64Var(&w.MemCap, "mem-cap", 0, "memory cap in bytes for the assigned layers (0: none)")
	fl.DurationVar(durationVar(&w.Heartbeat), "heartbeat", 0, "interval of liveness pings to the coordinator (default 1s)")
	fl.BoolVar(&w.Verbose, "verbose", false, "log stage assignments and joins")
	fl.StringVar(&w.Executor, "executor", w.Executor, "what computes the layers: go, or python (PyTorch)")
	fl.StringVar(&w.Python, "python", "", "with --executor python: the interpreter (default $SKYHIVE_PYTHON, else python3)")
	fl.StringVar(&w.Device, "device", w.Device, "with --executor python: auto (a GPU when there is one), cpu, cuda or cuda:N")
	f.metrics.register(fl)
}

// config is the worker the flags describe.
func (f *workerFlags) config() launch.Worker {
	w := f.w
	w.Net, w.Metrics = f.net.Net, f.metrics.addr
	return w
}

// workerDefaults is the worker of `skyhive worker` without flags.
func workerDefaults() launch.Worker {
	var f workerFlags
	f.register(pflag.NewFlagSet("worker", pflag.ContinueOnError))
	return f.config()
}

// runWorkerRole runs the worker w describes (pipeline.RunWorkerRole), its
// notices on stderr.
func runWorkerRole(ctx context.Context, _, stderr io.Writer, w launch.Worker) error {
	net := connectFlags{w.Net}
	host, err := net.config()
	if err != nil {
		return err
	}
	return flagError(pipeline.RunWorkerRole(ctx, w, host, stderr, startStageExecutor))
}

// stageElements sizes a worker executor's shared memory (float32s): a
// micro-batch's input and output side by side, and any one parameter.
// Pages never touched take no memory.
const stageElements = 1 << 28

// startStageExecutor starts the PyTorch executor of `skyhive worker
// --executor python` (bridge.StartExecutor of bridge.StageModule).
func startStageExecutor(ctx context.Context, python, device string, log io.Writer) (pipeline.RoleStageExecutor, error) {
	ex, err := bridge.StartExecutor(ctx, bridge.ExecutorConfig{Module: bridge.StageModule, Python: python, Device: device,
		Elements: stageElements, Log: log})
	if err != nil {
		return nil, err
	}
	return ex, nil
}
