package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/skyhive/skyhive/alloc"
	"github.com/skyhive/skyhive/profile"
	"github.com/spf13/cobra"
)

// planFlags are the options of `skyhive plan`.
type planFlags struct {
	cluster   string
	model     string
	strategy  string
	schedule  string
	micro     int
	batch     int
	objective string
	timeLimit time.Duration
	asJSON    bool
}

func newPlanCmd() *cobra.Command {
	var f planFlags
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
		RunE: func(cmd *cobra.Command, _ []string) error { return f.run(cmd.Context(), cmd.OutOrStdout()) },
	}
	fl := cmd.Flags()
	fl.StringVar(&f.cluster, "cluster", "", "cluster file: alloc cluster JSON, cluster profile or device profile (required)")
	fl.StringVar(&f.model, "model", "bert-large:160", "model: generator spec bert-large:N / bert-base:N, alloc model JSON or model profile")
	fl.StringVar(&f.strategy, "strategy", "all", "all or one of "+strings.Join(alloc.StrategyNames(), ", "))
	fl.StringVar(&f.schedule, "schedule", "", "sequential or gpipe (default: the model's own)")
	fl.IntVar(&f.micro, "micro", 0, "micro-batches of the gpipe schedule (implies gpipe when > 1)")
	renameFlags(fl, map[string]string{"micro-batches": "micro"})
	fl.IntVar(&f.batch, "batch", 0, "batch of a generator spec (default 32)")
	fl.StringVar(&f.objective, "objective", "iteration", "what skyhive minimises: iteration or bottleneck")
	fl.DurationVar(&f.timeLimit, "time-limit", alloc.DefaultOptimalTimeLimit, "time limit of each strategy's solve")
	fl.BoolVar(&f.asJSON, "json", false, "print one JSON object instead of tables")
	if err := cmd.MarkFlagRequired("cluster"); err != nil {
		panic(err) // the flag is defined just above
	}
	return cmd
}

// loadModel reads the model and applies --batch, --schedule and
// --micro-batches.
func (f *planFlags) loadModel() (*alloc.Model, error) {
	var m *alloc.Model
	var err error
	if f.batch != 0 {
		if f.batch < 0 {
			return nil, fmt.Errorf("--batch must be positive, got %d", f.batch)
		}
		if _, statErr := os.Stat(f.model); statErr == nil {
			return nil, fmt.Errorf("--batch applies to generator specs, and %s is a file (its batch is fixed)", f.model)
		}
		m, err = alloc.GenerateModel(f.model, f.batch, 0)
	} else {
		m, err = profile.LoadModel(f.model)
	}
	if err != nil {
		return nil, err
	}
	if f.micro < 0 {
		return nil, fmt.Errorf("--micro-batches must not be negative, got %d", f.micro)
	}
	switch f.schedule {
	case "":
		if f.micro > 0 {
			m.MicroBatches = f.micro
		}
	case "sequential":
		if f.micro > 1 {
			return nil, fmt.Errorf("--schedule sequential runs one batch at a time, but --micro-batches is %d", f.micro)
		}
		m.MicroBatches = 1
	case "gpipe":
		if f.micro > 0 {
			m.MicroBatches = f.micro
		}
		if m.MicroBatches < 2 {
			return nil, errors.New("--schedule gpipe needs --micro-batches M with M ≥ 2 (the model does not set it)")
		}
	default:
		return nil, fmt.Errorf("unknown --schedule %q (want sequential or gpipe)", f.schedule)
	}
	return m, nil
}

// strategies returns the strategies to run, by name.
func (f *planFlags) strategies() ([]alloc.Strategy, error) {
	names := alloc.StrategyNames()
	if f.strategy != "all" {
		if !slices.Contains(names, f.strategy) {
			return nil, fmt.Errorf("unknown --strategy %q (want all or one of %s)", f.strategy, strings.Join(names, ", "))
		}
		names = []string{f.strategy}
	}
	return alloc.Strategies(names, f.timeLimit)
}

func (f *planFlags) run(ctx context.Context, w io.Writer) error {
	if f.timeLimit <= 0 {
		return fmt.Errorf("--time-limit must be positive, got %v", f.timeLimit)
	}
	obj, err := alloc.ParseObjective(f.objective)
	if err != nil {
		return err
	}
	c, err := profile.LoadCluster(f.cluster)
	if err != nil {
		return err
	}
	m, err := f.loadModel()
	if err != nil {
		return err
	}
	strats, err := f.strategies()
	if err != nil {
		return err
	}
	p := alloc.Problem{Cluster: c, Model: m, Objective: obj}
	cmp, err := alloc.Compare(ctx, p, strats, alloc.CompareOptions{TimeLimit: f.timeLimit})
	if err != nil {
		return fmt.Errorf("plan: %w", err)
	}
	rep := alloc.PlanReport{ClusterName: f.cluster, ModelName: f.model, Cluster: c, Model: m, Objective: obj, Results: cmp}
	write := rep.WriteText
	if f.asJSON {
		write = rep.WriteJSON
	}
	if err := write(w); err != nil {
		return err
	}
	return rep.Err()
}
