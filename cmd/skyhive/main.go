// Command skyhive trains neural networks across many heterogeneous,
// unreliable machines: load-balanced pipelines, decentralized mixtures of
// experts and wait-avoiding group averaging, over libp2p.
package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"

	"github.com/libp2p/go-libp2p/gologshim"
	"github.com/skyhive/skyhive/launch"
	"github.com/skyhive/skyhive/metrics"
	"github.com/skyhive/skyhive/p2p"
	"github.com/skyhive/skyhive/tensor"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

func newRootCmd() *cobra.Command {
	var gemm, cpuProfile string
	var stopProfile func() error
	root := &cobra.Command{
		Use:           "skyhive",
		Short:         "Train neural networks across heterogeneous, geo-distributed, unreliable machines",
		SilenceUsage:  true,
		SilenceErrors: true,
		PersistentPreRunE: func(*cobra.Command, []string) error {
			if err := selectGEMM(gemm); err != nil {
				return err
			}
			var err error
			if stopProfile, err = metrics.StartCPUProfile(cpuProfile); err != nil {
				return fmt.Errorf("--cpuprofile: %w", err)
			}
			return nil
		},
		PersistentPostRunE: func(*cobra.Command, []string) error {
			if stopProfile == nil {
				return nil
			}
			return stopProfile()
		},
	}
	root.PersistentFlags().StringVar(&cpuProfile, "cpuprofile", "", "write a CPU profile of the command to this file, completed when the command succeeds (go tool pprof)")
	root.PersistentFlags().StringVar(&gemm, "gemm", "auto",
		"GEMM backend: auto (OpenBLAS if installed, the Go kernel for products issued while OpenBLAS is busy) "+
			"or go (the pure-Go kernel; fastest for many concurrent small products, e.g. experiment moe-convergence)")
	root.AddCommand(
		newBenchCmd(),
		newTrainCmd(),
		newDemoCmd(),
		newExperimentCmd(),
		newDHTCmd(),
		newPlanCmd(),
		newProfileCmd(),
		newWorkerCmd(),
		newServerCmd(),
		newPeerCmd(),
		newDoctorCmd(),
		newSwarmCmd(),
		newKeygenCmd(),
		newAttackCmd(),
		newStatusCmd(),
		newDashboardCmd(),
		newDaemonCmd(),
		newTokenizeCmd(),
		// Subcommands register here, one line each.
	)
	return root
}

func main() {
	// libp2p logs a failed start (e.g. a port in use) before returning the
	// error, which skyhive prints once, with a hint; GOLOG_LOG_LEVEL turns
	// libp2p's logs back on.
	if os.Getenv("GOLOG_LOG_LEVEL") == "" {
		gologshim.SetDefaultHandler(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError + 4}))
	}
	ctx, stopSignals := launch.WatchSignals(context.Background(), os.Stderr, os.Exit)
	var err error
	if path, ok := launch.FileArg(os.Args[1:]); ok {
		// A child process that a launcher started with a config file.
		err = runRoleFile(ctx, path, os.Stdout, os.Stderr)
	} else {
		root := newRootCmd()
		root.SetArgs(legacyTrainArgs(os.Args[1:], os.Stderr))
		err = root.ExecuteContext(ctx)
	}
	interrupted := stopSignals()
	if err != nil && interrupted && errors.Is(err, context.Canceled) {
		// Stopped by a signal before it finished: not a failure to explain.
		fmt.Fprintln(os.Stderr, "skyhive: stopped before finishing:", strings.Replace(err.Error(), context.Canceled.Error(), "interrupted", 1))
		os.Exit(launch.ForcedExit)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "skyhive:", withHint(err))
		os.Exit(1)
	}
}

// withHint adds what to do to errors from below the CLI that name no flag.
func withHint(err error) error {
	if errors.Is(err, p2p.ErrRelay) {
		return fmt.Errorf("%w (--relay must name a publicly reachable peer started with --relay-service)", err)
	}
	if strings.Contains(err.Error(), "address already in use") {
		flag := "--listen"
		if msg := err.Error(); strings.HasPrefix(msg, "--metrics") || strings.HasPrefix(msg, "metrics:") {
			flag = "--metrics" // metricsFlags.start names it
		}
		return fmt.Errorf("%w (the %s port is taken, perhaps by another skyhive: choose another port, or 0 for a free one)", err, flag)
	}
	return err
}

// selectGEMM configures the process's GEMM backend before any product is
// computed.
func selectGEMM(name string) error {
	if err := tensor.SelectBackend(name); err != nil {
		return fmt.Errorf("--gemm: %w", err)
	}
	return nil
}

// renameFlags keeps old flag names working as aliases of their new names
// (flags renamed so that one name means one thing in every command).
func renameFlags(fl *pflag.FlagSet, renamed map[string]string) {
	prev := fl.GetNormalizeFunc()
	fl.SetNormalizeFunc(func(f *pflag.FlagSet, name string) pflag.NormalizedName {
		if n, ok := renamed[name]; ok {
			name = n
		}
		return prev(f, name)
	})
}
