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
	root := &cobra.Command{
		Use:           "skyhive",
		Short:         "Train neural networks across heterogeneous, geo-distributed, unreliable machines",
		SilenceUsage:  true,
		SilenceErrors: true,
	}
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
