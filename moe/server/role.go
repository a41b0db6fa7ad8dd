package server

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"time"

	"github.com/skyhive/skyhive/internal/memlimit"
	"github.com/skyhive/skyhive/jsonl"
	"github.com/skyhive/skyhive/launch"
	"github.com/skyhive/skyhive/metrics"
	"github.com/skyhive/skyhive/moe"
	"github.com/skyhive/skyhive/node"
	"github.com/skyhive/skyhive/p2p"
	"github.com/skyhive/skyhive/wire"
)

// DefaultHidden is the experts' hidden size of `skyhive server` and of
// the MoE trainers without one: small enough that the default grid, or the
// 256 experts of a 16×16 one, start in a second on a laptop.
const DefaultHidden = 64

// Defaults returns the options of an expert server without any given,
// as `skyhive server` has them without flags, but for the network and
// process options: a 4×4 grid of small FFN experts, batches of up to 4096
// rows, checkpoints every 5 minutes, declarations and statistics every 30
// seconds. Lazy nil and QueueMemory 0 leave them to RunRole, which
// decides by the experts' memory and the memory budget (DefaultQueueMemory
// without one).
func Defaults() launch.Server {
	return launch.Server{
		Experts: "ffn.[0:4].[0:4]", ExpertType: TypeFFN, Hidden: DefaultHidden, Executor: ExecutorGo, Device: "auto",
		MinBatch: 1, MaxBatch: 4096, BatchTimeout: launch.Duration(2 * time.Millisecond), ParallelBatches: 1,
		LR: 1e-3, Clip: DefaultClipNorm, MaxSeqLen: DefaultMaxSeqLen, StepRows: 1, Seed: 1,
		CheckpointEvery: launch.Duration(5 * time.Minute), DeclareEvery: launch.Duration(30 * time.Second),
		StatsEvery: launch.Duration(30 * time.Second), MaxExperts: 1 << 16,
	}
}

// roleMessageBytes bounds a call's request and response on an expert
// server's host and a trainer's.
const roleMessageBytes = 256 << 20

// RoleConfig configures RunRole: an expert server on a node of its own, as
// `skyhive server` and `skyhive @FILE` run one.
type RoleConfig struct {
	// Node is the server's node: its host, the DHT peers it joins (none:
	// this server starts a DHT), the bound on the records it stores, its
	// status record's region and period, its metrics endpoint and its
	// log. RunRole sets the rest: a DHT server answering dial-back checks,
	// the status role, messages of up to 256 MiB.
	Node node.Config
	// Server is the server's options, as the command's flags and a config
	// file give them (see launch.Server). Its Net and Process are read
	// only through Node, except Net.MemoryMiB, the memory budget the
	// server plans (PlanMemory; QueueMemory 0 takes the plan's share).
	Server launch.Server
	// Stdout receives the statistics and Stderr the notices (nil:
	// discarded).
	Stdout, Stderr io.Writer
	// Announce, if set, tells where others reach the server once its
	// host runs, e.g. by printing its addresses.
	Announce func(ctx context.Context, h *p2p.Host)
	// StartExecutor starts the PyTorch executor of `--executor python`
	// (bridge.StartExecutor); nil refuses that executor.
	StartExecutor func(ctx context.Context, spec ExecutorSpec) (RoleExecutor, error)
}

// RunRole runs an expert server until ctx ends: it starts the node (host,
// DHT, metrics), creates the experts and serves them, publishes the status
// record, prints the experts' statistics every StatsEvery (a summary line,
// or a line per expert with Verbose, or JSON lines with JSON; appended to
// the Stats file too), and when ctx ends checkpoints, prints them once more
// and stops.
func RunRole(ctx context.Context, cfg RoleConfig) error {
	s := cfg.Server
	if cfg.Stdout == nil {
		cfg.Stdout = io.Discard
	}
	if cfg.Stderr == nil {
		cfg.Stderr = io.Discard
	}
	uids, err := moe.ParseExperts(s.Experts, s.MaxExperts)
	if err != nil {
		return err
	}
	if err := checkExecutor(s); err != nil {
		return err
	}
	python := s.Executor == ExecutorPython
	lazy := !python && lazyByDefault(len(uids), s.ExpertType, s.Hidden)
	if s.Lazy != nil {
		lazy = *s.Lazy
	}
	plan, err := planMemory(s, len(uids), lazy || python) // an executor's experts live in its process
	if err != nil {
		return err
	}
	n, err := startNode(ctx, cfg, plan.Requests)
	if err != nil {
		return err
	}
	defer n.Close()
	var exec RoleExecutor
	if python {
		if exec, err = startExecutor(ctx, cfg); err != nil {
			return err
		}
		defer exec.Close()
		fmt.Fprintf(cfg.Stderr, "expert server hosting %d experts built by %s (hidden %d) in a PyTorch %s executor on %s\n", len(uids), s.Module, s.Hidden, exec.Torch(), exec.Device())
	} else {
		fmt.Fprintf(cfg.Stderr, "expert server hosting %d %s experts (hidden %d, %s)\n", len(uids), s.ExpertType, s.Hidden, expertMemory(len(uids), s.ExpertType, s.Hidden, lazy))
	}
	if plan.Budget > 0 {
		fmt.Fprintf(cfg.Stderr, "%s (%s)\n", plan, plan.source)
	}
	if cfg.Announce != nil {
		cfg.Announce(ctx, n.Host())
	}
	if len(n.Seeds()) == 0 {
		fmt.Fprintln(cfg.Stderr, "no --dht given: this server is the DHT's first node; pass its address to others")
	}
	logs := newQuietHandler(slog.NewTextHandler(cfg.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}), s.Verbose)
	defer logs.flush(context.Background())
	scfg := Config{
		Transport: n.Host(), DHT: n.DHT(), Experts: uids, Type: s.ExpertType, Hidden: s.Hidden, Heads: s.Heads,
		MinBatch: s.MinBatch, MaxBatch: s.MaxBatch, BatchTimeout: time.Duration(s.BatchTimeout), Workers: s.ParallelBatches,
		LR: s.LR, ClipNorm: s.Clip, StepRows: s.StepRows, MaxSeqLen: s.MaxSeqLen,
		RequestMemory: s.RequestMemory << 20, QueueMemory: s.QueueMemory << 20, MemoryBudget: plan.Budget, ZeroInit: s.ZeroInit, Seed: s.Seed, Lazy: lazy,
		Limits:       WireLimits(s.MaxBatch, s.Hidden),
		DeclareEvery: time.Duration(s.DeclareEvery), CheckpointPath: s.Checkpoint, CheckpointEvery: time.Duration(s.CheckpointEvery),
		Logger:   slog.New(logs),
		Metrics:  n.Metrics(),
		Executor: exec, // nil without --executor python
	}
	srv, err := NewContext(ctx, scfg)
	if err != nil {
		return err
	}
	fmt.Fprintf(cfg.Stderr, "serving %s … %s; Ctrl-C to stop\n", uids[0], uids[len(uids)-1])
	if err := n.StartStatus(func(st *metrics.Status) { serverStatus(st, srv.Stats()) }); err != nil {
		return errors.Join(err, srv.Close())
	}
	if exec == nil {
		return serveStats(ctx, cfg, srv, logs)
	}
	// An executor that dies takes the experts with it: the server stops
	// (trainers route around it as around any dead server).
	run, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		select {
		case <-exec.Done():
			cancel()
		case <-run.Done():
		}
	}()
	err = serveStats(run, cfg, srv, logs)
	if gone := exec.Err(); gone != nil && ctx.Err() == nil {
		return fmt.Errorf("%w; the server stopped: fix the module or the machine and start it again (its checkpoint, if any, is from before)", gone)
	}
	return err
}

// rolePlan is a server's memory plan and what bounds its budget.
type rolePlan struct {
	MemoryPlan
	source string
}

// planMemory plans the process's memory (PlanMemory) within the smaller of
// the --memory-budget and the kernel's limits (package memlimit); the
// plan's Budget is 0 when neither is set.
func planMemory(s launch.Server, experts int, lazy bool) (rolePlan, error) {
	avail := memlimit.Available()
	budget := memlimit.Min(s.MemoryMiB<<20, avail.Heap())
	if budget <= 0 {
		return rolePlan{}, nil
	}
	source := "the memory budget"
	if budget != s.MemoryMiB<<20 {
		source = "the process's " + avail.Source
	}
	var weights int64
	if !lazy {
		weights = expertBytes(experts, s.ExpertType, s.Hidden)
	}
	p, err := PlanMemory(budget, weights)
	if err != nil {
		return rolePlan{}, fmt.Errorf("%s: %w", source, err)
	}
	return rolePlan{p, source}, nil
}

// startNode starts the server's node, its host reading at most
// requestBytes of requests at once (0: no bound); ctx ending is returned
// as is.
func startNode(ctx context.Context, cfg RoleConfig, requestBytes int64) (*node.Node, error) {
	ncfg := cfg.Node
	if ncfg.Host != nil {
		h := *ncfg.Host
		h.MaxMessageBytes, h.RequestMemory = roleMessageBytes, requestBytes
		ncfg.Host = &h
	} else {
		ncfg.Net.MaxMessageBytes = roleMessageBytes
	}
	ncfg.DHT.Mode, ncfg.ServeDialback, ncfg.Status.Role = node.DHTServer, true, metrics.RoleServer
	if ncfg.Log == nil {
		ncfg.Log = cfg.Stderr
	}
	n, err := node.New(ctx, ncfg)
	if err != nil && ctx.Err() != nil {
		return nil, ctx.Err()
	}
	return n, err
}

// WireLimits bounds decoded expert messages for batches of maxBatch rows
// of hidden values.
func WireLimits(maxBatch, hidden int) wire.Limits {
	return wire.Limits{MaxElements: min(2*maxBatch*hidden*128, 1<<26), MaxDims: 4, MaxTensors: 4}
}

// serveStats prints the server's statistics every StatsEvery (and appends
// them to the Stats file) until ctx ends, then closes srv, which
// checkpoints, and prints them once more.
func serveStats(ctx context.Context, cfg RoleConfig, srv *Server, logs *quietHandler) error {
	s := cfg.Server
	stats, closeStats, err := jsonl.Open(s.Stats)
	if err != nil {
		srv.Close()
		return err
	}
	defer closeStats()
	lines := jsonl.Writer{W: stats}
	show := func(st Stats, final bool) {
		lines.Write(st)
		switch {
		case s.JSON:
			_ = json.NewEncoder(cfg.Stdout).Encode(st)
		case s.Verbose:
			printServerStats(cfg.Stdout, st, len(st.Experts))
		case final:
			printServerStats(cfg.Stdout, st, busiestShown)
		default:
			printServerSummary(cfg.Stdout, st)
		}
		logs.flush(ctx)
	}
	var tick <-chan time.Time
	if every := time.Duration(s.StatsEvery); every > 0 {
		t := time.NewTicker(every)
		defer t.Stop()
		tick = t.C
	}
	for {
		select {
		case <-ctx.Done():
			fmt.Fprintln(cfg.Stderr, "stopping: checkpointing and closing")
			err := srv.Close()
			show(srv.Stats(), true)
			if err == nil && lines.Err != nil {
				err = fmt.Errorf("stats: %w", lines.Err)
			}
			return err
		case <-tick:
			show(srv.Stats(), false)
		}
	}
}

// lazyMemory is the memory of eagerly created experts above which a
// server creates them lazily unless told otherwise.
const lazyMemory = 1 << 30

// expertBytes is the memory of n experts once created: four float32s per
// parameter (weight, gradient, two AdamW moments).
func expertBytes(n int, typ string, hidden int) int64 {
	return int64(n) * ExpertParams(typ, hidden) * 16
}

// lazyByDefault reports whether n experts would take more than lazyMemory
// if all were created at start.
func lazyByDefault(n int, typ string, hidden int) bool {
	return expertBytes(n, typ, hidden) > lazyMemory
}

// expertMemory describes the experts' memory for the start-up line.
func expertMemory(n int, typ string, hidden int, lazy bool) string {
	mib := float64(expertBytes(n, typ, hidden)) / (1 << 20)
	if lazy {
		return fmt.Sprintf("created on first use, up to %.0f MiB", mib)
	}
	return fmt.Sprintf("%.0f MiB", mib)
}

// Executors of `skyhive server --executor`.
const (
	ExecutorGo     = "go"
	ExecutorPython = "python"
)

// checkExecutor checks the executor's options.
func checkExecutor(s launch.Server) error {
	switch s.Executor {
	case "", ExecutorGo:
		if s.Module != "" {
			return fmt.Errorf("module %s given without --executor python", s.Module)
		}
	case ExecutorPython:
		if s.Module == "" {
			return errors.New("the python executor needs --module package.module:function, the function that builds one expert")
		}
		if s.ZeroInit {
			return errors.New("zero-init applies to Skyhive's Go experts: start a PyTorch expert as the identity in its module's function (drop --zero-init)")
		}
	default:
		return fmt.Errorf("executor %q: want go or python (--executor)", s.Executor)
	}
	return nil
}

// startExecutor starts the PyTorch executor of a server, its output on
// the server's stderr; its shared memory holds a request's largest input,
// output gradient and output, and the largest parameter tensor of an FFN
// expert of this hidden size.
func startExecutor(ctx context.Context, cfg RoleConfig) (RoleExecutor, error) {
	s := cfg.Server
	if cfg.StartExecutor == nil {
		return nil, errors.New("this program cannot start a PyTorch executor: run skyhive server")
	}
	c := Config{Type: s.ExpertType, Hidden: s.Hidden, MaxBatch: s.MaxBatch, MaxSeqLen: s.MaxSeqLen}
	if c.MaxSeqLen == 0 {
		c.MaxSeqLen = DefaultMaxSeqLen
	}
	elems := max(3*c.maxInputElements(), 16*int64(s.Hidden)*int64(s.Hidden))
	if elems > 1<<31 {
		return nil, fmt.Errorf("a batch of %d rows of hidden %d needs %d MiB of shared memory per call: lower --max-batch", s.MaxBatch, s.Hidden, elems>>18)
	}
	fmt.Fprintf(cfg.Stderr, "starting the PyTorch executor (%s -m skyhive.executor, module %s)\n", cmp.Or(s.Python, os.Getenv("SKYHIVE_PYTHON"), "python3"), s.Module)
	return cfg.StartExecutor(ctx, ExecutorSpec{
		Module: s.Module, Python: s.Python, Device: s.Device, Elements: int(elems),
		LR: s.LR, Log: cfg.Stderr,
	})
}
