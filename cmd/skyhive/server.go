package main

import (
	"context"
	"io"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/skyhive/skyhive/bridge"
	"github.com/skyhive/skyhive/launch"
	"github.com/skyhive/skyhive/metrics"
	"github.com/skyhive/skyhive/moe/server"
	"github.com/skyhive/skyhive/node"
	"github.com/skyhive/skyhive/p2p"
)

// serverFlags are the options of `skyhive server`: its typed config
// (launch.Server) and the flag groups it shares with other commands.
type serverFlags struct {
	cfg     launch.Server
	lazy    bool
	net     connectFlags
	out     outputFlags
	status  statusFlags
	metrics metricsFlags
}

func newServerCmd() *cobra.Command {
	var f serverFlags
	cmd := &cobra.Command{
		Use:   "server",
		Short: "Host mixture-of-experts experts: batching runtime, per-expert optimizer, DHT declarations, checkpoints",
		Long: "Host many Learning@home experts in one process. Requests for each expert are queued and\n" +
			"processed in batches (oldest first across experts); backward calls update the expert with\n" +
			"its own AdamW. The experts and their grid prefixes are declared on the DHT and re-declared\n" +
			"while the server runs; weights and optimizer state are checkpointed on an interval and on\n" +
			"exit, and reloaded on restart. Per-expert statistics are printed periodically and served\n" +
			"over the stats RPC; --json prints them as JSON lines, --stats FILE appends them to FILE.",
		Example: "  skyhive server --experts 'ffn.[0:16].[0:16]' --dht /ip4/127.0.0.1/tcp/4001/p2p/12D3...\n" +
			"  skyhive server --experts 'ffn.[0:16].[0:16]' --hidden 1024 --lazy --dht /ip4/127.0.0.1/tcp/4001/p2p/12D3...\n" +
			"  skyhive server --experts 'ffn.[0:4].[0:4]' --hidden 64 --checkpoint experts.safetensors\n" +
			"  skyhive server --experts 'ffn.[0:4].[0:4]' --executor python --module mypkg.experts:make_ffn --device cuda",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return runServerRole(cmd.Context(), cmd.OutOrStdout(), cmd.ErrOrStderr(), f.config(cmd.Flags()))
		},
	}
	cmd.PreRunE = checkedNumbers(numberRules{Positive: []string{"hidden"}, Negative: []string{"clip"}})
	f.register(cmd.Flags())
	return cmd
}

// register adds the flags of `skyhive server`, with their defaults
// (server.Defaults).
func (f *serverFlags) register(fl *pflag.FlagSet) {
	f.cfg = server.Defaults()
	c := &f.cfg
	fl.StringVar(&c.Experts, "experts", c.Experts, "expert UIDs or patterns, e.g. 'ffn.[0:16].[0:16]' (comma-separated)")
	fl.StringVar(&c.ExpertType, "expert-type", c.ExpertType, "expert type: ffn (x + FFN(LN(x))) or transformer (BERT encoder layer)")
	fl.IntVar(&c.Hidden, "hidden", c.Hidden, "experts' hidden size (the trainers of train moe learn it from the DHT)")
	fl.IntVar(&c.Heads, "heads", 0, "attention heads of transformer experts (0: hidden/64)")
	f.net.register(fl, "DHT peers of the swarm to join: multiaddrs ending in /p2p/PEER_ID (none: this server starts a DHT)")
	fl.IntVar(&c.MinBatch, "min-batch", c.MinBatch, "rows an expert's queue waits for before it runs")
	fl.IntVar(&c.MaxBatch, "max-batch", c.MaxBatch, "maximum rows per batch (and per request)")
	fl.DurationVar(durationVar(&c.BatchTimeout), "batch-timeout", time.Duration(c.BatchTimeout), "longest wait for --min-batch rows")
	fl.IntVar(&c.ParallelBatches, "parallel-batches", c.ParallelBatches, "batches processed at once")
	fl.Float64Var(&c.LR, "lr", c.LR, "experts' AdamW learning rate")
	fl.Float64Var(&c.Clip, "clip", c.Clip, "gradient-norm clip of each expert step (negative disables; steps with non-finite gradients are always skipped)")
	fl.IntVar(&c.MaxSeqLen, "max-seq-len", c.MaxSeqLen, "longest sequence a transformer expert accepts")
	fl.Int64Var(&c.RequestMemory, "request-memory", 0, "working memory one request or batch may need, in MiB, estimated before it runs (0: 1024 or what the largest valid request needs)")
	fl.Int64Var(&c.QueueMemory, "queue-memory", server.DefaultQueueMemory>>20, "MiB of request tensors queued or running at once; beyond it requests are refused as busy")
	fl.StringVar(&c.Executor, "executor", c.Executor, "what computes the experts: go (Skyhive's own experts) or python (a PyTorch executor running --module)")
	fl.StringVar(&c.Module, "module", "", "with --executor python: the function that builds one expert, package.module:function; it is called with the hidden size and returns a torch.nn.Module")
	fl.StringVar(&c.Python, "python", "", "with --executor python: the interpreter that imports torch, the skyhive package and --module (default: $SKYHIVE_PYTHON, else python3)")
	fl.StringVar(&c.Device, "device", c.Device, "with --executor python: auto (CUDA when there is a GPU), cpu, cuda or cuda:N")
	fl.BoolVar(&c.ZeroInit, "zero-init", false, "start each FFN expert as the identity (zero output layer)")
	fl.IntVar(&c.StepRows, "step-rows", c.StepRows, "backward rows an expert accumulates per optimizer step (1: a step per backward batch)")
	fl.Uint64Var(&c.Seed, "seed", c.Seed, "seed of the initial weights (with each expert's UID)")
	fl.BoolVar(&f.lazy, "lazy", false, "create an expert's weights on its first request (default: when the experts would take more than 1 GiB)")
	fl.StringVar(&c.Checkpoint, "checkpoint", "", "safetensors file for weights and optimizer state (loaded if present)")
	fl.DurationVar(durationVar(&c.CheckpointEvery), "checkpoint-every", time.Duration(c.CheckpointEvery), "checkpoint interval (0: only on exit)")
	fl.DurationVar(durationVar(&c.DeclareEvery), "declare-every", time.Duration(c.DeclareEvery), "DHT declaration interval (records expire after twice this)")
	fl.DurationVar(durationVar(&c.StatsEvery), "stats-every", time.Duration(c.StatsEvery), "print the experts' statistics this often (0: only on exit)")
	fl.BoolVar(&c.Verbose, "verbose", false, "print a line per expert every --stats-every and every repeated warning (default: one summary line per interval, the busiest experts on exit, and repeated warnings counted)")
	f.out.register(fl, "the statistics (instead of tables), one object per line,", "the statistics, every --stats-every and on exit")
	renameFlags(fl, map[string]string{"stats-file": "stats", "workers": "parallel-batches"})
	fl.IntVar(&c.MaxExperts, "max-experts", c.MaxExperts, "refuse specifications with more experts")
	f.status.register(fl)
	f.metrics.register(fl)
}

// config turns the flags into the server's typed config. Without --lazy
// and --queue-memory they are left to the server (Lazy nil, QueueMemory
// 0), which decides by the experts' memory and --memory-budget.
func (f *serverFlags) config(fl *pflag.FlagSet) launch.Server {
	c := f.cfg
	c.Net = f.net.Net
	c.Process = f.status.process(f.metrics.addr)
	c.Output = launch.Output{JSON: f.out.json, Stats: f.out.stats}
	if fl.Changed("lazy") {
		lazy := f.lazy
		c.Lazy = &lazy
	}
	if !fl.Changed("queue-memory") {
		c.QueueMemory = 0
	}
	return c
}

// serverDefaults is the config of `skyhive server` without flags, which a
// config file's fields replace.
func serverDefaults() launch.Server {
	var f serverFlags
	fl := pflag.NewFlagSet("server", pflag.ContinueOnError)
	f.register(fl)
	return f.config(fl)
}

// runServerRole runs an expert server (server.RunRole) with its typed
// config, from the flags of `skyhive server` or from a config file: its
// statistics on stdout, its notices on stderr.
func runServerRole(ctx context.Context, stdout, stderr io.Writer, c launch.Server) error {
	host, err := roleHost(c.Net, c.Process)
	if err != nil {
		return err
	}
	var jsonOut io.Writer
	if c.JSON {
		jsonOut = stdout
	}
	return server.RunRole(ctx, server.RoleConfig{Node: node.FromLaunch(host, c.Net, c.Process, metrics.RoleServer),
		Server: c, Stdout: stdout, Stderr: stderr,
		Announce:      func(ctx context.Context, h *p2p.Host) { p2p.ReportReach(ctx, h, stdout, jsonOut) },
		StartExecutor: startExecutor})
}

// startExecutor starts the PyTorch executor of `skyhive server --executor
// python` (bridge.StartExecutor).
func startExecutor(ctx context.Context, s server.ExecutorSpec) (server.RoleExecutor, error) {
	ex, err := bridge.StartExecutor(ctx, bridge.ExecutorConfig{Module: s.Module, Python: s.Python, Device: s.Device,
		Elements: s.Elements, LR: s.LR, Log: s.Log})
	if err != nil {
		return nil, err
	}
	return ex, nil
}
