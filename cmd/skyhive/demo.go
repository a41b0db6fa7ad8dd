package main

import (
	"fmt"
	"os"

	"github.com/skyhive/skyhive/pipeline"
	"github.com/spf13/cobra"
)

// demoFlags are the options of `skyhive demo`.
type demoFlags struct {
	cfg  pipeline.DemoConfig
	data dataFlags
	out  outputFlags
}

func newDemoCmd() *cobra.Command {
	var d demoFlags
	cmd := &cobra.Command{
		Use:   "demo",
		Short: "Run the main job: a local heterogeneous swarm trains Fashion-MNIST through a pipeline",
		Long: "Run Skyhive's main job on this machine, with no cluster and no external service:\n" +
			"start worker processes with unequal speeds, profile them and the model's layers, plan the\n" +
			"pipeline with every allocation strategy, measure even, sky and skyhive plans side by side,\n" +
			"then train on Fashion-MNIST with the skyhive plan and evaluate on the test set.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error { return d.run(cmd) },
	}
	c, fl := &d.cfg, cmd.Flags()
	fl.IntVar(&c.Workers, "workers", 4, "local worker processes")
	fl.Float64Var(&c.SlowdownMax, "slowdown-max", 6, "worker slowdowns are drawn from U[1,MAX] as in Sky Computing")
	fl.StringVar(&c.Model, "model", "deep-mlp:256x8", "model: mlp, bert-tiny or deep-mlp:WIDTHxDEPTH")
	fl.IntVar(&c.Batch, "batch", 128, "examples per iteration")
	fl.IntVar(&c.Micro, "micro", 4, "micro-batches per iteration (1F1B schedule)")
	fl.IntVar(&c.Steps, "steps", 1000, "training iterations with the skyhive plan")
	fl.IntVar(&c.CompareIters, "compare-iters", 6, "timed iterations per strategy in the comparison (at least 5)")
	fl.Float64Var(&c.LR, "lr", 1e-3, "peak learning rate (AdamW)")
	fl.Uint64Var(&c.Seed, "seed", 1, "seed for slowdowns, initialisation and shuffling")
	d.data.register(fl)
	d.out.register(fl, "the result (measured plans, training)", "one per training iteration, with per-stage times")
	cmd.AddCommand(newDemoAveragingCmd())
	cmd.AddCommand(newDemoMoECmd())
	return cmd
}

// run runs the demo (pipeline.RunDemo): its steps on stdout, or on stderr
// with --json, which prints the result on stdout.
func (d *demoFlags) run(cmd *cobra.Command) error {
	cfg := d.cfg
	cfg.DataDir, cfg.Limit = d.data.dir, d.data.limit
	var err error
	if cfg.Binary, err = os.Executable(); err != nil {
		return fmt.Errorf("locating the skyhive binary: %w", err)
	}
	return flagError(pipeline.RunDemo(cmd.Context(), cfg, d.out.stats, d.out.json, cmd.OutOrStdout(), cmd.ErrOrStderr()))
}
