package bench

import (
	"context"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/skyhive/skyhive/launch"
)

// StopGrace is how long an interrupted suite may take to return before Run
// stops without it: a suite stops between measurements, and one
// measurement (a BERT-large layer step in the layers suite) can take
// seconds.
const StopGrace = time.Second

// Select returns the suites name asks for: those of All for "all", else
// the suite of that name. An unknown name's error lists the suites.
func Select(name string) ([]Suite, error) {
	if name == "all" {
		return All(), nil
	}
	s, ok := Find(name)
	if !ok {
		return nil, fmt.Errorf("unknown suite %q; suites:\n%s", name, List())
	}
	return []Suite{s}, nil
}

// List is the suites, All's then Long's, a line each: the name and what
// the suite measures.
func List() string {
	var b strings.Builder
	for _, s := range append(All(), Long()...) {
		fmt.Fprintf(&b, "  %-10s %s\n", s.Name, s.Short)
	}
	return b.String()
}

// Run runs the suites in turn, with metrics served on metricsAddr if it
// is set (RunWithMetrics), and writes the results of each to w: a table,
// or JSON lines with asJSON. Too few repetitions in o are a
// *launch.FieldError (reps).
func Run(ctx context.Context, suites []Suite, o Options, metricsAddr string, w io.Writer, asJSON bool) error {
	if o.Reps < 5 {
		return &launch.FieldError{Fields: []string{"reps"}, Text: fmt.Sprintf("%%s must be at least 5, got %d", o.Reps)}
	}
	write := WriteTable
	if asJSON {
		write = WriteJSON
	}
	for _, s := range suites {
		rs, err := runSuite(ctx, s, o, metricsAddr)
		if err != nil {
			return fmt.Errorf("bench %s: %w", s.Name, err)
		}
		if err := write(w, rs); err != nil {
			return err
		}
	}
	return nil
}

// runSuite runs s, with metrics served on metricsAddr if it is set. Once
// ctx is cancelled it waits at most StopGrace for the suite, which writes
// nothing but its results, and then returns ctx's error: the caller exits,
// taking the unfinished measurement with it.
func runSuite(ctx context.Context, s Suite, o Options, metricsAddr string) ([]Result, error) {
	type result struct {
		rs  []Result
		err error
	}
	done := make(chan result, 1)
	go func() {
		var r result
		if metricsAddr != "" {
			r.rs, r.err = RunWithMetrics(ctx, s, o, metricsAddr)
		} else {
			r.rs, r.err = s.Run(ctx, o)
		}
		done <- r
	}()
	select {
	case r := <-done:
		return r.rs, r.err
	case <-ctx.Done():
	}
	select {
	case r := <-done:
		return r.rs, r.err
	case <-time.After(StopGrace):
		return nil, ctx.Err()
	}
}
