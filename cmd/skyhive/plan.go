package main

import (
	"strings"

	"github.com/skyhive/skyhive/alloc"
	"github.com/skyhive/skyhive/profile"
	"github.com/spf13/cobra"
)

func newPlanCmd() *cobra.Command {
	var (
		c      profile.PlanConfig
		asJSON bool
	)
	cmd := &cobra.Command{
		Use:   "plan",
		Short: "Assign a model's layers to a cluster's devices and predict the iteration time",
		Long: `Plan a pipeline: split a model's layers over the devices of a cluster with one or
all allocation strategies (see docs/alloc.md), print each plan's per-stage table,
its predicted iteration time and solve time, and its speedup over "even".

--cluster takes an alloc cluster file (examples/cluster-*.json), a cluster
profile or a device profile (docs/profile.md). --model takes a generator spec
(bert-large:N, bert-base:N), an alloc model file or a model profile written by
"skyhive profile model --out".

If the cluster cannot hold the model, the command says by how much memory and
exits non-zero; so does any strategy that fails.`,
		Example: `  # Every strategy on 16 devices of four GPU types in one data centre:
  skyhive plan --cluster examples/cluster-hetero.json --model bert-large:160

  # Three regions joined by slow links, GPipe with 32 micro-batches, ours only:
  skyhive plan --cluster examples/cluster-geo.json --model bert-large:160 \
      --schedule gpipe --micro-batches 32 --strategy skyhive

  # Machine-readable, the paper's sequential schedule, optimal given 30 s:
  skyhive plan --cluster examples/cluster-geo.json --model bert-large:160 \
      --schedule sequential --strategy optimal --time-limit 30s --json

  # Plan with layers profiled from package nn:
  skyhive profile model --model bert-large:24 --batch 32 --out model.json
  skyhive plan --cluster examples/cluster-hetero.json --model model.json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			rep, err := profile.Plan(cmd.Context(), c)
			if err != nil {
				return flagError(err)
			}
			write := rep.WriteText
			if asJSON {
				write = rep.WriteJSON
			}
			if err := write(cmd.OutOrStdout()); err != nil {
				return err
			}
			return rep.Err()
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&c.Cluster, "cluster", "", "cluster file: alloc cluster JSON, cluster profile or device profile (required)")
	fl.StringVar(&c.Model, "model", "bert-large:160", "model: generator spec bert-large:N / bert-base:N, alloc model JSON or model profile")
	fl.StringVar(&c.Strategy, "strategy", "all", "all or one of "+strings.Join(alloc.StrategyNames(), ", "))
	fl.StringVar(&c.Schedule, "schedule", "", "sequential or gpipe (default: the model's own)")
	fl.IntVar(&c.Micro, "micro", 0, "micro-batches of the gpipe schedule (implies gpipe when > 1)")
	renameFlags(fl, map[string]string{"micro-batches": "micro"})
	fl.IntVar(&c.Batch, "batch", 0, "batch of a generator spec (default 32)")
	fl.StringVar(&c.Objective, "objective", "iteration", "what skyhive minimises: iteration or bottleneck")
	fl.DurationVar(&c.TimeLimit, "time-limit", alloc.DefaultOptimalTimeLimit, "time limit of each strategy's solve")
	fl.BoolVar(&asJSON, "json", false, "print one JSON object instead of tables")
	if err := cmd.MarkFlagRequired("cluster"); err != nil {
		panic(err) // the flag is defined just above
	}
	return cmd
}
