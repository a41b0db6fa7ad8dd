// Package bench runs Skyhive's benchmark suites and reports them as a table
// or as JSON lines, following the project's measurement protocol: ratios
// taken in one run, medians of at least five repetitions after a warm-up,
// with min and max to show the noise.
package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/skyhive/skyhive/stats"
)

// Result is one measured number, optionally with the reference it is
// compared against. It marshals to the protocol's JSON line.
type Result struct {
	Suite         string  `json:"suite"`
	Case          string  `json:"case"`
	Metric        string  `json:"metric"`
	Value         float64 `json:"value"`
	Unit          string  `json:"unit"`
	Min           float64 `json:"min,omitempty"`
	Max           float64 `json:"max,omitempty"`
	Baseline      string  `json:"baseline,omitempty"`
	BaselineValue float64 `json:"baseline_value,omitempty"`
	Ratio         float64 `json:"ratio,omitempty"`
	Note          string  `json:"note,omitempty"`
}

// WithBaseline sets the reference and the ratio value/baseline.
func (r Result) WithBaseline(name string, value float64) Result {
	r.Baseline = name
	r.BaselineValue = value
	if value != 0 {
		r.Ratio = r.Value / value
	}
	return r
}

// Options are shared by all suites.
type Options struct {
	// Quick keeps a suite under 30 s.
	Quick bool
	// Reps is the number of measured repetitions (at least 5).
	Reps int
	// Log receives progress lines; nil discards them.
	Log io.Writer
	// Duration is the length of suites that run for a set time (soak);
	// 0 takes the suite's default.
	Duration time.Duration
	// Metrics, if set, receives the Prometheus collectors of the
	// components the suites build (p2p hosts, DHT nodes, expert servers,
	// averaging optimizers, the pipeline coordinator), each registration
	// under its own InstanceLabel; nil: no metrics. RunWithMetrics sets it
	// and scrapes it while the suite runs (skyhive bench --metrics).
	Metrics prometheus.Registerer
}

// Logf writes a progress line if o.Log is set.
func (o Options) Logf(format string, args ...any) {
	if o.Log != nil {
		fmt.Fprintf(o.Log, format+"\n", args...)
	}
}

// Stats summarises repeated measurements.
type Stats = stats.Summary[float64]

// Summarize returns the median, min and max of xs.
func Summarize(xs []float64) Stats { return stats.Summarize(xs) }

// TimeAlternating runs warm-up calls of a and b, then reps alternating
// measurements A B A B…, and returns the durations of each in seconds. It
// stops between calls, with ctx's error, once ctx is cancelled.
func TimeAlternating(ctx context.Context, reps, warmup int, a, b func()) (ta, tb []float64, err error) {
	for i := 0; i < warmup; i++ {
		if err := ctx.Err(); err != nil {
			return nil, nil, err
		}
		a()
		if b != nil {
			b()
		}
	}
	for i := 0; i < reps; i++ {
		if err := ctx.Err(); err != nil {
			return nil, nil, err
		}
		t0 := time.Now()
		a()
		ta = append(ta, time.Since(t0).Seconds())
		if b != nil {
			t0 = time.Now()
			b()
			tb = append(tb, time.Since(t0).Seconds())
		}
	}
	return ta, tb, nil
}

// WriteJSON writes one JSON object per line.
func WriteJSON(w io.Writer, rs []Result) error {
	enc := json.NewEncoder(w)
	for _, r := range rs {
		if err := enc.Encode(r); err != nil {
			return fmt.Errorf("bench: write json: %w", err)
		}
	}
	return nil
}

// WriteTable writes a human-readable table.
func WriteTable(w io.Writer, rs []Result) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "SUITE\tCASE\tMETRIC\tVALUE\tUNIT\tMIN..MAX\tBASELINE\tRATIO")
	for _, r := range rs {
		rng, base, ratio := "", "", ""
		if r.Min != 0 || r.Max != 0 {
			rng = fmt.Sprintf("%.4g..%.4g", r.Min, r.Max)
		}
		if r.Baseline != "" {
			base = fmt.Sprintf("%s=%.4g", r.Baseline, r.BaselineValue)
			ratio = fmt.Sprintf("%.3f", r.Ratio)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%.4g\t%s\t%s\t%s\t%s\n", r.Suite, r.Case, r.Metric, r.Value, r.Unit, rng, base, ratio)
	}
	return tw.Flush()
}

// Suite is a named benchmark.
type Suite struct {
	Name  string
	Short string
	// Run measures the suite; it stops early, with ctx's error, when ctx
	// is cancelled.
	Run func(ctx context.Context, o Options) ([]Result, error)
}
