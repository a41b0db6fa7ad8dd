package main

import (
	"fmt"
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/skyhive/skyhive/models"
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

// runLocal trains in this process (train.RunLocal): a language model
// (--model gpt-mini) on text (--data gcide by default), an image model on
// Fashion-MNIST. An interrupted run with a checkpoint says how to resume.
func (f *trainFlags) runLocal(cmd *cobra.Command) error {
	ctx, fl := cmd.Context(), cmd.Flags()
	c := train.Local{Config: f.cfg, Data: f.dataset, DataDir: f.data.dir, Limit: f.data.limit, LM: f.lm.cfg,
		CorpusBytes: f.lm.corpusBytes, TokenWidth: f.lm.tokenWidth, JSON: f.out.json, Stats: f.out.stats, MetricsAddr: f.metrics.addr,
		Given: func(option string) bool { return fl.Changed(strings.ReplaceAll(option, "_", "-")) }}
	c.LM.Vocab, c.LM.Seq, c.LM.EvalTokens = f.lm.vocab, f.lm.seq, f.lm.evalTokens
	err := flagError(train.RunLocal(ctx, c, cmd.OutOrStdout(), cmd.ErrOrStderr()))
	if err != nil && c.Checkpoint != "" && ctx.Err() != nil && !strings.Contains(err.Error(), "resume") {
		return fmt.Errorf("%w (continue with --resume)", err) // interrupted: how to go on
	}
	return err
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
