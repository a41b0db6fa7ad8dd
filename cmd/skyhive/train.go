package main

import (
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/skyhive/skyhive/data"
	"github.com/skyhive/skyhive/models"
	"github.com/skyhive/skyhive/tensor"
	"github.com/skyhive/skyhive/train"
	"github.com/spf13/cobra"
)

// trainFlags are the options of a local training run shared by train and demo.
type trainFlags struct {
	mode    string
	cfg     train.Config
	dataset string
	dataDir string
	limit   int
	asJSON  bool
	pipe    pipelineFlags  // --mode pipeline (pipeline.go)
	avg     averagingFlags // --mode averaging (averaging.go)
	moe     moeFlags       // --mode moe (moe.go)
}

func (f *trainFlags) register(cmd *cobra.Command) {
	fl := cmd.Flags()
	fl.StringVar(&f.mode, "mode", "local", "training mode: "+strings.Join(slices.Sorted(maps.Keys(trainModes())), ", "))
	fl.StringVar(&f.cfg.Model, "model", "mlp", "model: "+models.Usage())
	fl.StringVar(&f.dataset, "data", "fashion-mnist", "data set (fashion-mnist)")
	fl.StringVar(&f.dataDir, "data-dir", data.DefaultDir, "directory holding the Fashion-MNIST IDX files")
	fl.IntVar(&f.cfg.Epochs, "epochs", 12, "passes over the training set")
	fl.IntVar(&f.cfg.BatchSize, "batch", 128, "examples per step")
	fl.Float64Var(&f.cfg.LR, "lr", 1e-3, "peak learning rate (AdamW, cosine decay)")
	fl.Float64Var(&f.cfg.WeightDecay, "weight-decay", 0.01, "AdamW decoupled weight decay")
	fl.Int64Var(&f.cfg.Warmup, "warmup", 200, "learning-rate warm-up steps")
	fl.Float64Var(&f.cfg.ClipNorm, "clip", 5, "global gradient-norm clip (0 disables)")
	fl.Uint64Var(&f.cfg.Seed, "seed", 1, "seed for initialisation, dropout and shuffling")
	fl.StringVar(&f.cfg.Checkpoint, "checkpoint", "", "save a checkpoint here after every epoch and on Ctrl-C")
	fl.BoolVar(&f.cfg.Resume, "resume", false, "continue from --checkpoint if it exists")
	fl.IntVar(&f.limit, "limit", 0, "use only the first N training examples (0 = all)")
	fl.BoolVar(&f.asJSON, "json", false, "print the result as JSON at the end")
}

// trainMode runs one kind of training from the shared flags; distributed
// modes add their own flags in their own files.
type trainMode func(f *trainFlags, cmd *cobra.Command) error

// trainModes maps --mode values to their runners, one line each.
func trainModes() map[string]trainMode {
	return map[string]trainMode{
		"local":     (*trainFlags).runLocal,
		"pipeline":  (*trainFlags).runPipeline,
		"averaging": (*trainFlags).runAveraging,
		"moe":       (*trainFlags).runMoE,
	}
}

func (f *trainFlags) run(cmd *cobra.Command) error {
	mode, ok := trainModes()[f.mode]
	if !ok {
		return fmt.Errorf("unknown --mode %q (want one of %s)", f.mode, strings.Join(slices.Sorted(maps.Keys(trainModes())), ", "))
	}
	return mode(f, cmd)
}

// runLocal trains in this process.
func (f *trainFlags) runLocal(cmd *cobra.Command) error {
	if f.dataset != "fashion-mnist" {
		return fmt.Errorf("unknown data set %q (supported: fashion-mnist)", f.dataset)
	}
	if f.limit < 0 {
		return fmt.Errorf("--limit must not be negative, got %d", f.limit)
	}
	if err := f.cfg.Validate(); err != nil {
		return err
	}
	out := cmd.ErrOrStderr()
	opt := data.LoadOptions{Standardize: true, Limit: f.limit}
	trainSet, err := data.LoadFashionMNIST(f.dataDir, data.Train, opt)
	if err != nil {
		return err
	}
	testSet, err := data.LoadFashionMNIST(f.dataDir, data.Test, data.LoadOptions{Standardize: true})
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "training %s on Fashion-MNIST: %d train / %d test examples, GEMM backend %s\n",
		f.cfg.Model, trainSet.Len(), testSet.Len(), tensor.Backend())
	res, err := train.Run(cmd.Context(), f.cfg, trainSet, testSet, out)
	if err != nil {
		if f.cfg.Checkpoint != "" && cmd.Context().Err() != nil {
			return fmt.Errorf("%w (continue with --resume)", err)
		}
		return err
	}
	if f.asJSON {
		enc := json.NewEncoder(cmd.OutOrStdout())
		enc.SetIndent("", "  ")
		return enc.Encode(res)
	}
	fmt.Fprintf(cmd.OutOrStdout(), "test accuracy %.2f%% after %d epochs in %.1fs (%d parameters)\n",
		100*res.TestAccuracy, len(res.Epochs), res.Seconds, res.Params)
	return nil
}

func newTrainCmd() *cobra.Command {
	var f trainFlags
	cmd := &cobra.Command{
		Use:   "train",
		Short: "Train a model on Fashion-MNIST in this process",
		Long: "Train a model on Fashion-MNIST with AdamW and a cosine schedule, showing loss, throughput\n" +
			"and ETA, and evaluating on the test set after every epoch. With --checkpoint the run is\n" +
			"saved atomically after every epoch and on Ctrl-C; --resume continues from it.\n\n" +
			"Models (--model of the local, pipeline and averaging modes; the same --seed gives the\n" +
			"same weights in every mode):\n" + models.Help("  "),
		Example: "  skyhive train --model mlp --data fashion-mnist\n" +
			"  skyhive train --model bert-tiny --epochs 3 --checkpoint bert.safetensors --resume",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error { return f.run(cmd) },
	}
	f.register(cmd)
	f.pipe.register(cmd)
	f.avg.register(cmd)
	f.moe.register(cmd)
	return cmd
}
