package main

import (
	"errors"
	"fmt"
	"log/slog"
	"os"

	"github.com/skyhive/skyhive/p2p"
	"github.com/skyhive/skyhive/pipeline"
	"github.com/spf13/cobra"
)

func newWorkerCmd() *cobra.Command {
	var cfg pipeline.WorkerConfig
	var net connectFlags
	var mf metricsFlags
	var verbose bool
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
			"--mem-cap refuses stages needing more memory than BYTES.",
		Example: "  skyhive worker --join /ip4/10.0.0.1/tcp/4001/p2p/12D3KooW... --listen /ip4/0.0.0.0/tcp/0\n" +
			"  skyhive worker --join $COORD --slowdown 2.5 --mem-cap 2000000000",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			level := slog.LevelWarn
			if verbose {
				level = slog.LevelInfo
			}
			cfg.Logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
			var err error
			if cfg.Host, err = net.config(); err != nil {
				return err
			}
			reg, stopMetrics, err := mf.start(cmd.Context(), cmd.ErrOrStderr())
			if err != nil {
				return err
			}
			defer stopMetrics()
			cfg.Host.Metrics, cfg.Metrics = reg.Registerer(), reg.Registerer()
			cfg.Reach = func(r p2p.Reach) { printReach(cmd.ErrOrStderr(), r) }
			err = pipeline.RunWorker(cmd.Context(), cfg)
			if errors.Is(err, pipeline.ErrCoordinatorAddr) {
				return fmt.Errorf("--join: %w", err)
			}
			return err
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&cfg.Join, "join", "", "coordinator multiaddr ending in /p2p/<peer id> (required)")
	fl.StringVar(&cfg.Name, "name", "", "name shown in the coordinator's tables (default: peer ID)")
	net.register(fl, "")
	fl.Float64Var(&cfg.Slowdown, "slowdown", 1, "emulated slowdown factor (>= 1)")
	fl.BoolVar(&cfg.Steady, "steady", false, "emulate a steady device: --slowdown multiplies the median busy time of each op's recent executions, not this one's, so the host's second-to-second noise does not reach the emulated speed")
	fl.StringVar(&cfg.Region, "region", "", "network region of this worker (plans group stages by region; required by coordinators that emulate links)")
	fl.Int64Var(&cfg.MemCap, "mem-cap", 0, "memory cap in bytes for the assigned layers (0: none)")
	fl.DurationVar(&cfg.Heartbeat, "heartbeat", 0, "interval of liveness pings to the coordinator (default 1s)")
	fl.BoolVar(&verbose, "verbose", false, "log stage assignments and joins")
	mf.register(fl)
	cmd.MarkFlagRequired("join")
	return cmd
}
