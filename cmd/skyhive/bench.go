package main

import (
	"os"

	"github.com/skyhive/skyhive/bench"
	"github.com/spf13/cobra"
)

func newBenchCmd() *cobra.Command {
	var opts bench.Options
	var asJSON bool
	var metricsAddr string
	cmd := &cobra.Command{
		Use:   "bench SUITE|all",
		Short: "Run a benchmark suite and print a table, or JSON lines with --json",
		Long: "Run a benchmark suite. Every suite compares against a reference measured in the same run\n" +
			"and reports medians of at least 5 repetitions with min and max. With --metrics ADDR the\n" +
			"components a suite builds (p2p hosts, DHT nodes, expert servers, averaging optimizers, the\n" +
			"pipeline coordinator) carry Prometheus metrics, served on http://ADDR/metrics and scraped\n" +
			"every second while the suite runs: compare with a run without to measure what metrics cost\n" +
			"(docs/observability.md).\n\nSuites:\n" + bench.List(),
		Example: "  skyhive bench rpc --json > off.jsonl\n" +
			"  skyhive bench rpc --json --metrics 127.0.0.1:0 > on.jsonl   # port 0: a free port",
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			suites, err := bench.Select(args[0])
			if err != nil {
				return err
			}
			opts.Log = os.Stderr
			return flagError(bench.Run(cmd.Context(), suites, opts, metricsAddr, cmd.OutOrStdout(), asJSON))
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print one JSON object per line")
	cmd.Flags().BoolVar(&opts.Quick, "quick", false, "smaller cases, under 30 s per suite")
	cmd.Flags().IntVar(&opts.Reps, "reps", 5, "measured repetitions per case (at least 5)")
	cmd.Flags().DurationVar(&opts.Duration, "duration", 0, "run length of timed suites (soak; 0: the suite's default)")
	cmd.Flags().StringVar(&metricsAddr, "metrics", "", "give the suite's components Prometheus metrics, serve them on http://ADDR/metrics and scrape them every second (e.g. 127.0.0.1:0), to measure their cost")
	return cmd
}
