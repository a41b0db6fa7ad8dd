// Command skyhive trains neural networks across many heterogeneous,
// unreliable machines: load-balanced pipelines, decentralized mixtures of
// experts and wait-avoiding group averaging, over libp2p.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/cobra"
)

func newRootCmd() *cobra.Command {
	var gemm string
	root := &cobra.Command{
		Use:           "skyhive",
		Short:         "Train neural networks across heterogeneous, geo-distributed, unreliable machines",
		SilenceUsage:  true,
		SilenceErrors: true,
		PersistentPreRunE: func(*cobra.Command, []string) error {
			return selectGEMM(gemm)
		},
	}
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
		// Subcommands register here, one line each.
	)
	return root
}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := newRootCmd().ExecuteContext(ctx)
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "skyhive:", err)
		os.Exit(1)
	}
}

// selectGEMM configures the process's GEMM backend before any product is
// computed; package tensor reads SKYHIVE_BLAS once, at the first GEMM.
func selectGEMM(name string) error {
	switch name {
	case "auto":
		return nil
	case "go":
		return os.Setenv("SKYHIVE_BLAS", "go")
	}
	return fmt.Errorf("--gemm must be auto or go, not %q", name)
}
