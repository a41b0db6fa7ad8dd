package main

import (
	"github.com/skyhive/skyhive/data"
	"github.com/skyhive/skyhive/experiment"
	"github.com/spf13/cobra"
)

func newExperimentCmd() *cobra.Command {
	var o experiment.Options
	cmd := &cobra.Command{
		Use:   "experiment NAME",
		Short: "Reproduce a paper's experiment; writes NAME.json and NAME.png to --out",
		Long:  "Reproduce one of the papers' experiments. Experiments:\n" + experiment.List(),
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			e, err := experiment.Lookup(args[0])
			if err != nil {
				return err
			}
			o.Log = cmd.ErrOrStderr()
			return e.Launch(cmd.Context(), o)
		},
	}
	cmd.Flags().StringVar(&o.Out, "out", "results", "directory for NAME.json and NAME.png")
	cmd.Flags().BoolVar(&o.Quick, "quick", false, "a shrunken smoke run")
	cmd.Flags().StringSliceVar(&o.Only, "only", nil, "run only these of the experiment's runs, comma-separated (moe-convergence: dmoe-64-100ms, ..., large-ffn; averaging-convergence: wagma, allreduce, local; sky-computing: grid points WORKERSxLAYERS, e.g. 4x8,16x48; geo-data-parallel and geo-data-parallel-lm: allreduce, local, wagma, diloco, wa-diloco)")
	cmd.Flags().Uint64Var(&o.Seed, "seed", 1, "seed for everything random")
	cmd.Flags().IntVar(&o.Repeats, "repeats", 1, "geo-data-parallel, geo-data-parallel-lm and sky-computing: run everything this many times, with seeds --seed, --seed+1, ..., and judge the targets over the repetitions (geo-data-parallel[-lm]: medians of the times to target; sky-computing: medians of every cell)")
	cmd.Flags().StringVar(&o.DataDir, "data-dir", data.DefaultDir, "directory holding the Fashion-MNIST IDX files (experiments on text read GCIDE from its Debian package)")
	return cmd
}
