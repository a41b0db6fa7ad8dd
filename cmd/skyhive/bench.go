package main

import (
	"context"
	"fmt"
	"os"
	"strings"
	"time"

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
			"(docs/observability.md).\n\nSuites:\n" + suiteList(),
		Example: "  skyhive bench rpc --json > off.jsonl\n" +
			"  skyhive bench rpc --json --metrics 127.0.0.1:0 > on.jsonl   # port 0: a free port",
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			var suites []bench.Suite
			if args[0] == "all" {
				suites = bench.All()
			} else {
				s, ok := bench.Find(args[0])
				if !ok {
					return fmt.Errorf("unknown suite %q; suites:\n%s", args[0], suiteList())
				}
				suites = []bench.Suite{s}
			}
			if opts.Reps < 5 {
				return fmt.Errorf("--reps must be at least 5, got %d", opts.Reps)
			}
			opts.Log = os.Stderr
			for _, s := range suites {
				rs, err := runSuite(cmd.Context(), s, opts, metricsAddr)
				if err != nil {
					return fmt.Errorf("bench %s: %w", s.Name, err)
				}
				if asJSON {
					err = bench.WriteJSON(cmd.OutOrStdout(), rs)
				} else {
					err = bench.WriteTable(cmd.OutOrStdout(), rs)
				}
				if err != nil {
					return err
				}
			}
			return nil
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print one JSON object per line")
	cmd.Flags().BoolVar(&opts.Quick, "quick", false, "smaller cases, under 30 s per suite")
	cmd.Flags().IntVar(&opts.Reps, "reps", 5, "measured repetitions per case (at least 5)")
	cmd.Flags().DurationVar(&opts.Duration, "duration", 0, "run length of timed suites (soak; 0: the suite's default)")
	cmd.Flags().StringVar(&metricsAddr, "metrics", "", "give the suite's components Prometheus metrics, serve them on http://ADDR/metrics and scrape them every second (e.g. 127.0.0.1:0), to measure their cost")
	return cmd
}

// benchStopGrace is how long an interrupted suite may take to return
// before the command stops without it: a suite stops between
// measurements, and one measurement (a BERT-large layer step in the layers
// suite) can take seconds.
const benchStopGrace = time.Second

// runSuite runs s, with metrics served on metricsAddr if it is set. Once
// ctx is cancelled it waits at most benchStopGrace for the suite, which
// writes nothing but its results, and then returns ctx's error: the
// command exits, taking the unfinished measurement with it.
func runSuite(ctx context.Context, s bench.Suite, opts bench.Options, metricsAddr string) ([]bench.Result, error) {
	type result struct {
		rs  []bench.Result
		err error
	}
	done := make(chan result, 1)
	go func() {
		var r result
		if metricsAddr != "" {
			r.rs, r.err = bench.RunWithMetrics(ctx, s, opts, metricsAddr)
		} else {
			r.rs, r.err = s.Run(ctx, opts)
		}
		done <- r
	}()
	select {
	case r := <-done:
		return r.rs, r.err
	case <-ctx.Done():
	}
	select {
	case r := <-done:
		return r.rs, r.err
	case <-time.After(benchStopGrace):
		return nil, ctx.Err()
	}
}

func suiteList() string {
	var b strings.Builder
	for _, s := range bench.All() {
		fmt.Fprintf(&b, "  %-10s %s\n", s.Name, s.Short)
	}
	for _, s := range bench.Long() {
		fmt.Fprintf(&b, "  %-10s %s\n", s.Name, s.Short)
	}
	return b.String()
}
