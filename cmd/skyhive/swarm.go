package main

import (
	"fmt"
	"os"
	"time"

	"github.com/spf13/cobra"

	"github.com/skyhive/skyhive/bench"
	"github.com/skyhive/skyhive/jsonl"
	"github.com/skyhive/skyhive/swarm"
)

func newSwarmCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "swarm",
		Short: "Run a described swarm of skyhive processes (namespaces, WAN links, NAT, failures)",
		Args:  cobra.NoArgs,
		RunE:  func(cmd *cobra.Command, _ []string) error { return cmd.Help() },
	}
	cmd.AddCommand(newSwarmRunCmd())
	return cmd
}

type swarmRunFlags struct {
	dir       string
	isolation string
	timeout   time.Duration
	out       outputFlags
}

func newSwarmRunCmd() *cobra.Command {
	var f swarmRunFlags
	cmd := &cobra.Command{
		Use:   "run SPEC",
		Short: "Start every peer of a swarm spec as a separate process, fire its failures, report",
		Long: "Start the swarm SPEC describes (see docs/swarm.md and examples/swarm/): every peer is a\n" +
			"separate skyhive process (dht, relay, server, trainer, peer, coordinator or worker). As root\n" +
			"each runs in its own network namespace with its own IP, joined by netem's router, which\n" +
			"emulates the spec's per-region latency, bandwidth and loss; peers with \"nat\": true sit\n" +
			"behind a NAT and join through a relay. Without root the peers run on loopback and links are\n" +
			"not emulated. The failure schedule kills, pauses, slows, partitions and restarts peers.\n" +
			"The run ends when every training peer has ended; the services are then stopped, and\n" +
			"nothing is left running. It prints a summary, or with --json the benchmark protocol's\n" +
			"lines (suite swarm, case the spec's name); every peer's log and result is in --dir, with\n" +
			"summary.png, a chart of the run: per peer the MB sent and received through the router\n" +
			"(else the test accuracy), its role, state and accuracy, and the failures that hit it.",
		Example: "  sudo skyhive swarm run examples/swarm/averaging.json\n" +
			"  sudo skyhive swarm run examples/swarm/pipeline.json --json --dir results/pipeline\n" +
			"  skyhive swarm run examples/swarm/moe.json --isolation processes   # no root: loopback",
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error { return f.run(cmd, args[0]) },
	}
	fl := cmd.Flags()
	fl.StringVar(&f.dir, "dir", "", "directory for the peers' logs, results and keys (default: results/swarm-NAME)")
	fl.StringVar(&f.isolation, "isolation", "", "namespaces (root: a network namespace per peer) or processes (loopback); default: the spec's, else namespaces when possible")
	fl.DurationVar(&f.timeout, "timeout", 0, "stop the run after this long (default: the spec's timeout, else 10m)")
	f.out.register(fl, "the benchmark protocol's lines", "the run's result (every peer's state, result and bytes)")
	return cmd
}

// run runs the swarm of the spec at path (swarm.RunFile) and prints it
// (bench.WriteSwarm).
func (f *swarmRunFlags) run(cmd *cobra.Command, path string) error {
	exe, err := os.Executable()
	if err != nil {
		return fmt.Errorf("locating the skyhive binary: %w", err)
	}
	stats, closeStats, err := f.out.openStats()
	if err != nil {
		return err
	}
	defer closeStats()
	res, runErr := swarm.RunFile(cmd.Context(), path, swarm.RunConfig{
		Binary: exe, Dir: f.dir, Isolation: f.isolation, Timeout: f.timeout,
		Log: cmd.ErrOrStderr(),
	})
	if res == nil {
		return runErr
	}
	(&jsonl.Writer{W: stats}).Write(res)
	bench.WriteSwarm(cmd.OutOrStdout(), res, f.out.json)
	return runErr
}
