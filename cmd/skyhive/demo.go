package main

import (
	"github.com/spf13/cobra"
)

func newDemoCmd() *cobra.Command {
	var f trainFlags
	cmd := &cobra.Command{
		Use:   "demo",
		Short: "Run the main job: train a real model on Fashion-MNIST with sane defaults",
		Long: "Run Skyhive's main job on this machine with no cluster and no external service:\n" +
			"train the Fashion-MNIST MLP and evaluate it on the test set.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error { return f.run(cmd) },
	}
	f.register(cmd)
	return cmd
}
