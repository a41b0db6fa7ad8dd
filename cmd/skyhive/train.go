package main

import (
	"context"
	"fmt"
	"io"
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/skyhive/skyhive/data"
	"github.com/skyhive/skyhive/models"
	"github.com/skyhive/skyhive/tensor"
	"github.com/skyhive/skyhive/train"
)

// trainFlags are the options that train local, train pipeline and train
// moe share: the run's length, AdamW with a cosine schedule, the seed, the
// data and the output.
type trainFlags struct {
	cfg     train.Config
	steps   int    // pipeline and moe: stop after N steps (0: --epochs)
	dataset string // --data
	data    dataFlags
	lm      lmFlags // train local: language models
	out     outputFlags
	metrics metricsFlags // registered by the commands that serve metrics
}

// register adds the flags every AdamW training command has.
func (f *trainFlags) register(fl *pflag.FlagSet) {
	fl.IntVar(&f.cfg.Epochs, "epochs", 12, "passes over the training set")
	fl.IntVar(&f.cfg.BatchSize, "batch", 128, "examples per step")
	fl.Float64Var(&f.cfg.LR, "lr", 1e-3, "peak learning rate (AdamW, cosine decay)")
	fl.Float64Var(&f.cfg.WeightDecay, "weight-decay", 0.01, "AdamW decoupled weight decay")
	fl.Int64Var(&f.cfg.Warmup, "warmup", 200, "learning-rate warm-up steps")
	fl.Uint64Var(&f.cfg.Seed, "seed", 1, "seed for initialisation, dropout and shuffling")
	f.data.register(fl)
}

// registerModel adds --model, --data, --clip and checkpointing, which the
// modes that build a model of the registry have.
func (f *trainFlags) registerModel(fl *pflag.FlagSet, datasets string) {
	fl.StringVar(&f.cfg.Model, "model", "mlp", "model: "+models.Usage())
	fl.StringVar(&f.dataset, "data", "fashion-mnist", "data set ("+datasets+")")
	fl.Float64Var(&f.cfg.ClipNorm, "clip", 5, "global gradient-norm clip (0 disables)")
	fl.StringVar(&f.cfg.Checkpoint, "checkpoint", "", "save a checkpoint here after every epoch and on Ctrl-C")
	fl.BoolVar(&f.cfg.Resume, "resume", false, "continue from --checkpoint if it exists")
}

// runLocal trains in this process.
// A language model (--model gpt-mini) trains on text (--data gcide by
// default); an image model on Fashion-MNIST.
func (f *trainFlags) runLocal(cmd *cobra.Command) error {
	reg, stopMetrics, err := f.metrics.start(cmd.Context(), cmd.ErrOrStderr())
	if err != nil {
		return err
	}
	defer stopMetrics()
	f.cfg.Metrics = reg.Registerer()
	if err := knownModel(f.cfg.Model); err != nil {
		return err
	}
	lm, dataset := train.IsLanguageModel(f.cfg.Model), f.dataset
	if lm && !cmd.Flags().Changed("data") {
		dataset = "gcide"
	}
	textData := train.IsTextData(dataset)
	switch {
	case lm && dataset == "fashion-mnist":
		return fmt.Errorf("%s is a language model and fashion-mnist is images: train it on text (--data %s), or train an image model (--model %s) on fashion-mnist",
			f.cfg.Model, train.TextDataUsage, models.Usage())
	case lm && textData:
		return f.runLM(cmd, dataset)
	case textData:
		return fmt.Errorf("%s is an image classifier and %s is text: train a language model on it (--model gpt-mini), or train %s on fashion-mnist",
			f.cfg.Model, dataset, f.cfg.Model)
	case dataset != "fashion-mnist":
		return fmt.Errorf("unknown data set %q (supported: fashion-mnist for image models; %s for language models)", dataset, train.TextDataUsage)
	}
	if err := checkImageFlags(cmd.Flags(), f.cfg.Model); err != nil {
		return err
	}
	if err := f.cfg.Validate(); err != nil {
		return err
	}
	out := cmd.ErrOrStderr()
	trainSet, testSet, err := f.data.load()
	if err != nil {
		return err
	}
	stats, closeStats, err := f.out.openStats()
	if err != nil {
		return err
	}
	defer closeStats()
	cfg := f.cfg
	cfg.Stats = stats
	input := data.FashionMNISTPreprocessing(true) // dataFlags.load standardizes
	cfg.Input = &input
	fmt.Fprintf(out, "training %s on Fashion-MNIST: %d train / %d test examples, GEMM backend %s\n",
		cfg.Model, trainSet.Len(), testSet.Len(), tensor.Backend())
	res, err := train.Run(cmd.Context(), cfg, trainSet, testSet, out)
	if err != nil {
		return resumeHint(cmd.Context(), cfg.Checkpoint, err)
	}
	if res.Resumed && len(res.Epochs) == 0 && !f.out.json {
		fmt.Fprintf(cmd.OutOrStdout(), "%s has finished all %d epochs: nothing left to do (test accuracy %.2f%%; raise --epochs to train further)\n",
			cfg.Checkpoint, cfg.Epochs, 100*res.TestAccuracy)
		return nil
	}
	return writeResult(cmd.OutOrStdout(), res, f.out.json)
}

// resumeHint adds how to continue to the error of a run with a checkpoint
// that was interrupted.
func resumeHint(ctx context.Context, checkpoint string, err error) error {
	if checkpoint != "" && ctx.Err() != nil && !strings.Contains(err.Error(), "resume") {
		return fmt.Errorf("%w (continue with --resume)", err)
	}
	return err
}

// writeResult prints a training result as JSON, or as text.
func writeResult(w io.Writer, r train.TextWriter, asJSON bool) error {
	if asJSON {
		return printJSON(w, r)
	}
	r.WriteText(w)
	return nil
}

// knownModel reports a --model whose name the registry does not know,
// suggesting the closest name when one is a likely typo, and listing the
// names (their parameters are checked when the model is built).
func knownModel(spec string) error {
	known, best, names := train.ClosestModel(spec)
	if known {
		return nil
	}
	hint := ""
	if best != "" {
		hint = fmt.Sprintf(" (did you mean %s?)", best)
	}
	return fmt.Errorf("--model %s: unknown model%s; the models are %s (skyhive train --help describes them)",
		spec, hint, strings.Join(names, ", "))
}

// newTrainCmd is `skyhive train`: local training itself, and a subcommand
// per distributed mode.
func newTrainCmd() *cobra.Command {
	cmd := newTrainLocalCmd("train")
	cmd.Short = "Train a model on Fashion-MNIST or a language model on text: in this process, or as a pipeline, a mixture of experts or an averaging swarm"
	cmd.Long += "\n\nThe distributed modes are subcommands: train pipeline, train moe and train averaging;\n" +
		"`skyhive train` alone is `skyhive train local`."
	cmd.AddCommand(newTrainLocalCmd("local"), newTrainPipelineCmd(), newTrainMoECmd(), newTrainAveragingCmd())
	return cmd
}

func newTrainLocalCmd(use string) *cobra.Command {
	var f trainFlags
	cmd := &cobra.Command{
		Use:   use,
		Short: "Train a model on Fashion-MNIST, or a language model on text, in this process",
		Long: "Train a model on Fashion-MNIST with AdamW and a cosine schedule, showing loss, throughput\n" +
			"and ETA, and evaluating on the test set after every epoch. With --checkpoint the run is\n" +
			"saved atomically after every epoch and on Ctrl-C; --resume continues from it.\n\n" +
			"Models (--model of train local, train pipeline and train averaging; the same --seed gives\n" +
			"the same weights in every mode):\n" + strings.TrimRight(models.Help(models.ImageClassification, "  "), "\n") + "\n\n" +
			"Language models (--model gpt-mini) train on text: --data gcide (the GCIDE dictionary, the\n" +
			"default), text:PATH (a plain text file) or tokens:PATH (a nanoGPT token file, with --vocab\n" +
			"and --token-width). Text is tokenized with a byte-level BPE of --vocab tokens trained on it;\n" +
			"a tenth is held out. The model trains for --duration (or --steps) on next-token cross\n" +
			"entropy, then its validation perplexity is measured next to a count-based bigram's on the\n" +
			"same tokens, and it writes a sample from --prompt. Without the flag, --batch is " + fmt.Sprint(lmDefaults.Batch) + ", --lr " + fmt.Sprint(lmDefaults.LR) + ",\n" +
			"--warmup " + fmt.Sprint(lmDefaults.Warmup) + " and --clip " + fmt.Sprint(lmDefaults.ClipNorm) + " for a language model. A checkpoint holds the tokenizer.\n" +
			"A GPT size without parameters gets the tokenizer's vocabulary and --seq:\n" +
			strings.TrimRight(models.Help(models.LanguageModeling, "  "), "\n"),
		Example: "  skyhive train --model mlp --data fashion-mnist\n" +
			"  skyhive train --model bert-tiny --epochs 3 --checkpoint bert.safetensors --resume\n" +
			"  skyhive train --model gpt-mini --data gcide --json\n" +
			"  skyhive train --model gpt-mini --data text:book.txt --vocab 2048 --duration 10m --checkpoint lm.safetensors\n" +
			"  skyhive train --model gpt-mini --data tokens:train.bin --vocab 50257 --seq 256",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error { return f.runLocal(cmd) },
	}
	cmd.PreRunE = checkedNumbers(numberRules{Positive: []string{"epochs", "batch", "lr"}})
	fl := cmd.Flags()
	f.register(fl)
	f.registerModel(fl, "fashion-mnist for image models; for language models gcide (their default), gcide:PATH, text:PATH or tokens:PATH")
	f.lm.register(fl)
	fl.Lookup("model").Usage = "model: " + models.Usage() + "; language models: gpt-mini, gpt-small, gpt-medium (the tokenizer's vocabulary and --seq) or " + models.LMUsage()
	f.out.register(fl, "the result (epochs, accuracy, time; language models: perplexities, bigram, ratio, sample)", "one per epoch (language models: every tenth of the run)")
	f.metrics.register(fl)
	return cmd
}
