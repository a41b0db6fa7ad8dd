package main

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/skyhive/skyhive/dht"
	"github.com/skyhive/skyhive/metrics"
	"github.com/skyhive/skyhive/moe"
	"github.com/skyhive/skyhive/moe/server"
	"github.com/skyhive/skyhive/p2p"
	"github.com/skyhive/skyhive/p2p/dialback"
)

// serverFlags are the options of `skyhive server`.
type serverFlags struct {
	experts      string
	expertType   string
	hidden       int
	heads        int
	net          connectFlags
	minBatch     int
	maxBatch     int
	batchTimeout time.Duration
	workers      int
	lr           float64
	clip         float64
	maxSeqLen    int
	requestMiB   int64
	queueMiB     int64
	stepRows     int
	zeroInit     bool
	seed         uint64
	lazy         bool
	checkpoint   string
	ckptEvery    time.Duration
	declareEvery time.Duration
	statsEvery   time.Duration
	out          outputFlags
	maxExperts   int
	status       statusFlags
	metrics      metricsFlags
	verbose      bool
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
			"  skyhive server --experts 'ffn.[0:4].[0:4]' --hidden 64 --checkpoint experts.safetensors",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error { return runServer(cmd, f) },
	}
	cmd.PreRunE = checkedNumbers(numberRules{Positive: []string{"hidden"}, Negative: []string{"clip"}})
	fl := cmd.Flags()
	fl.StringVar(&f.experts, "experts", "ffn.[0:4].[0:4]", "expert UIDs or patterns, e.g. 'ffn.[0:16].[0:16]' (comma-separated)")
	fl.StringVar(&f.expertType, "expert-type", server.TypeFFN, "expert type: ffn (x + FFN(LN(x))) or transformer (BERT encoder layer)")
	fl.IntVar(&f.hidden, "hidden", defaultHidden, "experts' hidden size (the trainers of train moe learn it from the DHT)")
	fl.IntVar(&f.heads, "heads", 0, "attention heads of transformer experts (0: hidden/64)")
	f.net.register(fl, "DHT peers of the swarm to join: multiaddrs ending in /p2p/PEER_ID (none: this server starts a DHT)")
	fl.IntVar(&f.minBatch, "min-batch", 1, "rows an expert's queue waits for before it runs")
	fl.IntVar(&f.maxBatch, "max-batch", 4096, "maximum rows per batch (and per request)")
	fl.DurationVar(&f.batchTimeout, "batch-timeout", 2*time.Millisecond, "longest wait for --min-batch rows")
	fl.IntVar(&f.workers, "parallel-batches", 1, "batches processed at once")
	fl.Float64Var(&f.lr, "lr", 1e-3, "experts' AdamW learning rate")
	fl.Float64Var(&f.clip, "clip", server.DefaultClipNorm, "gradient-norm clip of each expert step (negative disables; steps with non-finite gradients are always skipped)")
	fl.IntVar(&f.maxSeqLen, "max-seq-len", server.DefaultMaxSeqLen, "longest sequence a transformer expert accepts")
	fl.Int64Var(&f.requestMiB, "request-memory", 0, "working memory one request or batch may need, in MiB, estimated before it runs (0: 1024 or what the largest valid request needs)")
	fl.Int64Var(&f.queueMiB, "queue-memory", server.DefaultQueueMemory>>20, "MiB of request tensors queued or running at once; beyond it requests are refused as busy")
	fl.BoolVar(&f.zeroInit, "zero-init", false, "start each FFN expert as the identity (zero output layer)")
	fl.IntVar(&f.stepRows, "step-rows", 1, "backward rows an expert accumulates per optimizer step (1: a step per backward batch)")
	fl.Uint64Var(&f.seed, "seed", 1, "seed of the initial weights (with each expert's UID)")
	fl.BoolVar(&f.lazy, "lazy", false, "create an expert's weights on its first request (default: when the experts would take more than 1 GiB)")
	fl.StringVar(&f.checkpoint, "checkpoint", "", "safetensors file for weights and optimizer state (loaded if present)")
	fl.DurationVar(&f.ckptEvery, "checkpoint-every", 5*time.Minute, "checkpoint interval (0: only on exit)")
	fl.DurationVar(&f.declareEvery, "declare-every", 30*time.Second, "DHT declaration interval (records expire after twice this)")
	fl.DurationVar(&f.statsEvery, "stats-every", 30*time.Second, "print the experts' statistics this often (0: only on exit)")
	fl.BoolVar(&f.verbose, "verbose", false, "print a line per expert every --stats-every and every repeated warning (default: one summary line per interval, the busiest experts on exit, and repeated warnings counted)")
	f.out.register(fl, "the statistics (instead of tables), one object per line,", "the statistics, every --stats-every and on exit")
	renameFlags(fl, map[string]string{"stats-file": "stats", "workers": "parallel-batches"})
	fl.IntVar(&f.maxExperts, "max-experts", 1<<16, "refuse specifications with more experts")
	f.status.register(fl)
	f.metrics.register(fl)
	return cmd
}

func runServer(cmd *cobra.Command, f serverFlags) error {
	ctx := cmd.Context()
	uids, err := moe.ParseExperts(f.experts, f.maxExperts)
	if err != nil {
		return err
	}
	if err := f.status.check(); err != nil {
		return err
	}
	seeds, err := f.net.seeds()
	if err != nil {
		return err
	}
	hcfg, err := f.net.config()
	if err != nil {
		return err
	}
	hcfg.MaxMessageBytes = 256 << 20
	if b := f.net.memoryMiB; b > 0 && !cmd.Flags().Changed("queue-memory") {
		// Queued requests' tensors get at most a quarter of the budget.
		f.queueMiB = min(f.queueMiB, max(b/4, 1))
	}
	reg, stopMetrics, err := f.metrics.start(ctx, cmd.ErrOrStderr())
	if err != nil {
		return err
	}
	defer stopMetrics()
	hcfg.Metrics = reg.Registerer()
	h, err := p2p.New(ctx, hcfg)
	if err != nil {
		return err
	}
	defer h.Close()
	dialback.Serve(h)
	node, err := dht.New(h, dht.Config{PrivKey: h.LibP2P().Peerstore().PrivKey(h.ID()), MaxBytes: f.net.dhtMaxBytes(), Metrics: reg.Registerer()})
	if err != nil {
		return err
	}
	defer node.Close()
	out := cmd.OutOrStdout()
	var jsonOut io.Writer
	if f.out.json {
		jsonOut = out
	}
	if !cmd.Flags().Changed("lazy") {
		f.lazy = lazyByDefault(len(uids), f.expertType, f.hidden)
	}
	fmt.Fprintf(cmd.ErrOrStderr(), "expert server hosting %d %s experts (hidden %d, %s)\n", len(uids), f.expertType, f.hidden, expertMemory(len(uids), f.expertType, f.hidden, f.lazy))
	reportReach(ctx, h, out, jsonOut)
	if len(seeds) > 0 {
		bctx, cancel := context.WithTimeout(ctx, time.Minute)
		err := node.Bootstrap(bctx, seeds)
		cancel()
		if err != nil {
			return fmt.Errorf("join DHT: %w", err)
		}
	} else {
		fmt.Fprintln(cmd.ErrOrStderr(), "no --dht given: this server is the DHT's first node; pass its address to others")
	}
	logs := newQuietHandler(slog.NewTextHandler(cmd.ErrOrStderr(), &slog.HandlerOptions{Level: slog.LevelWarn}), f.verbose)
	defer logs.flush(context.Background())
	srv, err := server.NewContext(ctx, server.Config{
		Transport: h, DHT: node, Experts: uids, Type: f.expertType, Hidden: f.hidden, Heads: f.heads,
		MinBatch: f.minBatch, MaxBatch: f.maxBatch, BatchTimeout: f.batchTimeout, Workers: f.workers,
		LR: f.lr, ClipNorm: f.clip, StepRows: f.stepRows, MaxSeqLen: f.maxSeqLen,
		RequestMemory: f.requestMiB << 20, QueueMemory: f.queueMiB << 20, ZeroInit: f.zeroInit, Seed: f.seed, Lazy: f.lazy,
		Limits:       wireLimitsFor(f.maxBatch, f.hidden),
		DeclareEvery: f.declareEvery, CheckpointPath: f.checkpoint, CheckpointEvery: f.ckptEvery,
		Logger:  slog.New(logs),
		Metrics: reg.Registerer(),
	})
	if err != nil {
		return err
	}
	fmt.Fprintf(cmd.ErrOrStderr(), "serving %s … %s; Ctrl-C to stop\n", uids[0], uids[len(uids)-1])
	defer f.status.start(ctx, cmd.ErrOrStderr(), h, node, metrics.RoleServer, func(s *metrics.Status) { serverStatus(s, srv.Stats()) })()
	return f.serve(ctx, cmd.ErrOrStderr(), out, srv, logs)
}

// serve prints the server's statistics every --stats-every (and appends
// them to --stats) until ctx ends, then closes srv, which checkpoints, and
// prints them once more.
func (f *serverFlags) serve(ctx context.Context, log, out io.Writer, srv *server.Server, logs *quietHandler) error {
	stats, closeStats, err := f.out.openStats()
	if err != nil {
		srv.Close()
		return err
	}
	defer closeStats()
	lines := jsonLines{w: stats}
	show := func(st server.Stats, final bool) {
		lines.write(st)
		switch {
		case f.out.json:
			_ = json.NewEncoder(out).Encode(st)
		case f.verbose:
			printServerStats(out, st, len(st.Experts))
		case final:
			printServerStats(out, st, busiestShown)
		default:
			printServerSummary(out, st)
		}
		logs.flush(ctx)
	}
	var tick <-chan time.Time
	if f.statsEvery > 0 {
		t := time.NewTicker(f.statsEvery)
		defer t.Stop()
		tick = t.C
	}
	for {
		select {
		case <-ctx.Done():
			fmt.Fprintln(log, "stopping: checkpointing and closing")
			err := srv.Close()
			show(srv.Stats(), true)
			if err == nil && lines.err != nil {
				err = fmt.Errorf("--stats: %w", lines.err)
			}
			return err
		case <-tick:
			show(srv.Stats(), false)
		}
	}
}

// defaultHidden is the experts' hidden size of `server` and of the MoE
// trainers without --hidden: small enough that the default grid, or the
// 256 experts of a 16×16 one, start in a second on a laptop.
const defaultHidden = 64

// lazyMemory is the memory of eagerly created experts above which a
// server creates them lazily unless --lazy is given.
const lazyMemory = 1 << 30

// expertBytes is the memory of n experts once created: four float32s per
// parameter (weight, gradient, two AdamW moments).
func expertBytes(n int, typ string, hidden int) int64 {
	return int64(n) * server.ExpertParams(typ, hidden) * 16
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

// busiestShown is how many experts the table on exit lists without
// --verbose: the busiest.
const busiestShown = 10

// printServerSummary prints one line for all experts: how many were
// called, and their calls, batches, latencies, updates and errors.
func printServerSummary(w io.Writer, st server.Stats) {
	var fwd, bwd server.CallStats
	var active int
	var updates, skipped int64
	for _, e := range st.Experts {
		if e.Forward.Requests+e.Backward.Requests+e.Forward.Errors+e.Backward.Errors > 0 {
			active++
		}
		fwd = addCalls(fwd, e.Forward)
		bwd = addCalls(bwd, e.Backward)
		updates += e.Updates
		skipped += e.SkippedSteps
	}
	declared := "not yet declared"
	if !st.LastDeclared.IsZero() {
		declared = "declared " + st.LastDeclared.Format(time.TimeOnly)
	}
	fmt.Fprintf(w, "uptime %.0fs: %d of %d experts called; forward %d (batch %.1f, %v), backward %d (batch %.1f, %v); %d updates, %d skipped, %d errors; %s, %d failed DHT stores\n",
		st.UptimeSeconds, active, len(st.Experts),
		fwd.Requests, fwd.MeanBatch(), fwd.MeanLatency().Round(10*time.Microsecond),
		bwd.Requests, bwd.MeanBatch(), bwd.MeanLatency().Round(10*time.Microsecond),
		updates, skipped, fwd.Errors+bwd.Errors, declared, st.DeclareFailures)
}

// addCalls sums two experts' counters (MaxBatch: the larger).
func addCalls(a, b server.CallStats) server.CallStats {
	a.Requests += b.Requests
	a.Errors += b.Errors
	a.Batches += b.Batches
	a.Rows += b.Rows
	a.MaxBatch = max(a.MaxBatch, b.MaxBatch)
	a.LatencySeconds += b.LatencySeconds
	a.RunSeconds += b.RunSeconds
	return a
}

// printServerStats prints a summary and one line per expert that has seen
// requests, the busiest first, at most limit of them.
func printServerStats(w io.Writer, st server.Stats, limit int) {
	printServerSummary(w, st)
	calls := func(e server.ExpertStats) int64 {
		return e.Forward.Requests + e.Backward.Requests + e.Forward.Errors + e.Backward.Errors
	}
	var called []server.ExpertStats
	for _, e := range st.Experts {
		if calls(e) > 0 {
			called = append(called, e)
		}
	}
	if len(called) == 0 {
		fmt.Fprintln(w, "(no requests yet)")
		return
	}
	slices.SortStableFunc(called, func(a, b server.ExpertStats) int { return cmp.Compare(calls(b), calls(a)) })
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "EXPERT\tFWD REQ\tFWD BATCH\tFWD LAT\tBWD REQ\tBWD BATCH\tBWD LAT\tUPDATES\tSKIPPED\tERRORS")
	for _, e := range called[:min(limit, len(called))] {
		fmt.Fprintf(tw, "%s\t%d\t%.1f\t%v\t%d\t%.1f\t%v\t%d\t%d\t%d\n", e.UID,
			e.Forward.Requests, e.Forward.MeanBatch(), e.Forward.MeanLatency().Round(10*time.Microsecond),
			e.Backward.Requests, e.Backward.MeanBatch(), e.Backward.MeanLatency().Round(10*time.Microsecond),
			e.Updates, e.SkippedSteps, e.Forward.Errors+e.Backward.Errors)
	}
	tw.Flush()
	if n := len(called) - limit; n > 0 {
		fmt.Fprintf(w, "… and %d more experts called (--verbose lists them all)\n", n)
	}
}

// quietHandler passes log records on to next, except that at default
// verbosity a message repeated is counted rather than printed: the first of
// each kind (level and message) is written, later ones are counted, and
// flush (called every --stats-every) writes one line per kind counting
// them, with the last one's attributes. A kind quiet for a whole interval
// is forgotten, so its next record is written at once. With verbose every
// record is written.
type quietHandler struct {
	next    slog.Handler
	verbose bool
	// mu guards kinds, shared by the handlers WithAttrs and WithGroup
	// derive.
	mu    *sync.Mutex
	kinds map[string]*logKind
}

// logKind counts one kind of message since the last flush.
type logKind struct {
	first      time.Time // of the first one counted
	suppressed int
	last       slog.Record // the last one counted
}

func newQuietHandler(next slog.Handler, verbose bool) *quietHandler {
	return &quietHandler{next: next, verbose: verbose, mu: &sync.Mutex{}, kinds: map[string]*logKind{}}
}

// Enabled implements slog.Handler.
func (q *quietHandler) Enabled(ctx context.Context, l slog.Level) bool { return q.next.Enabled(ctx, l) }

// Handle implements slog.Handler.
func (q *quietHandler) Handle(ctx context.Context, r slog.Record) error {
	if q.verbose {
		return q.next.Handle(ctx, r)
	}
	key := r.Level.String() + " " + r.Message
	q.mu.Lock()
	if k := q.kinds[key]; k != nil {
		if k.suppressed == 0 {
			k.first = r.Time
		}
		k.suppressed++
		k.last = r.Clone()
		q.mu.Unlock()
		return nil
	}
	q.kinds[key] = &logKind{}
	q.mu.Unlock()
	return q.next.Handle(ctx, r)
}

// flush writes, for each kind with records counted since the last flush,
// one line counting them, and forgets the kinds that had none.
func (q *quietHandler) flush(ctx context.Context) {
	q.mu.Lock()
	var out []slog.Record
	for key, k := range q.kinds {
		if k.suppressed == 0 {
			delete(q.kinds, key)
			continue
		}
		r := k.last.Clone()
		r.Message = fmt.Sprintf("%s (%d times since %s; the last:)", r.Message, k.suppressed, k.first.Format(time.TimeOnly))
		out = append(out, r)
		k.suppressed = 0
	}
	q.mu.Unlock()
	slices.SortFunc(out, func(a, b slog.Record) int { return a.Time.Compare(b.Time) })
	for _, r := range out {
		_ = q.next.Handle(ctx, r)
	}
}

// WithAttrs implements slog.Handler.
func (q *quietHandler) WithAttrs(as []slog.Attr) slog.Handler {
	c := *q
	c.next = q.next.WithAttrs(as)
	return &c
}

// WithGroup implements slog.Handler.
func (q *quietHandler) WithGroup(name string) slog.Handler {
	c := *q
	c.next = q.next.WithGroup(name)
	return &c
}

// serverStatus fills an expert server's status record from its counters:
// optimizer updates as steps, forward rows as samples, and the experts'
// calls.
func serverStatus(s *metrics.Status, st server.Stats) {
	e := &metrics.ExpertsStatus{Hosted: len(st.Experts)}
	for _, x := range st.Experts {
		s.Step += x.Updates
		s.Samples += x.Forward.Rows
		calls, errs := x.Forward.Requests+x.Backward.Requests, x.Forward.Errors+x.Backward.Errors
		e.Requests += calls
		e.Errors += errs
		e.Loads = append(e.Loads, metrics.ExpertLoad{UID: x.UID, Calls: calls, Rows: x.Forward.Rows + x.Backward.Rows, Errors: errs})
	}
	s.Experts = e
}
