package server

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/skyhive/skyhive/metrics"
)

// busiestShown is how many experts the table on exit lists without
// --verbose: the busiest.
const busiestShown = 10

// printServerSummary prints one line for all experts: how many were
// called, and their calls, batches, latencies, updates and errors.
func printServerSummary(w io.Writer, st Stats) {
	var fwd, bwd CallStats
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
func addCalls(a, b CallStats) CallStats {
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
func printServerStats(w io.Writer, st Stats, limit int) {
	printServerSummary(w, st)
	calls := func(e ExpertStats) int64 {
		return e.Forward.Requests + e.Backward.Requests + e.Forward.Errors + e.Backward.Errors
	}
	var called []ExpertStats
	for _, e := range st.Experts {
		if calls(e) > 0 {
			called = append(called, e)
		}
	}
	if len(called) == 0 {
		fmt.Fprintln(w, "(no requests yet)")
		return
	}
	slices.SortStableFunc(called, func(a, b ExpertStats) int { return cmp.Compare(calls(b), calls(a)) })
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
func serverStatus(s *metrics.Status, st Stats) {
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
