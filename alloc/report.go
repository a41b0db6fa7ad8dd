package alloc

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"text/tabwriter"
	"time"
)

// PlanReport is a comparison of strategies on one problem with what it was
// run on, for printing (skyhive plan).
type PlanReport struct {
	// ClusterName and ModelName are the cluster and model as given (a
	// file name or a generator spec).
	ClusterName, ModelName string
	Cluster                *Cluster
	Model                  *Model
	Objective              Objective
	Results                Comparisons
}

// Err joins the failures of the run into one error, the memory shortfall
// first; nil if every strategy asked for succeeded.
func (rep PlanReport) Err() error {
	cmp := rep.Results
	var errs []error
	var me *MemoryError
	if base := cmp.Baseline(); errors.As(base.Err, &me) {
		return fmt.Errorf("the cluster cannot hold the model: %w", base.Err)
	}
	for _, o := range cmp.Asked() {
		if o.Err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", o.Strategy, o.Err))
		}
	}
	if len(errs) == 0 {
		return nil
	}
	return fmt.Errorf("plan failed: %w", errors.Join(errs...))
}

// describe summarises the cluster and the model for the text header.
func describe(c *Cluster, m *Model) (cluster, model string) {
	var speed float64
	var mem int64
	for _, d := range c.Devices {
		speed += d.Speed
		mem += d.MemBytes
	}
	var need int64
	for _, l := range m.Layers {
		need += l.MemBytes()
	}
	sched := "sequential"
	if m.Micro() > 1 {
		sched = fmt.Sprintf("gpipe M=%d", m.Micro())
	}
	cluster = fmt.Sprintf("%d devices in %d region(s), %.1f TFLOP/s, %s", len(c.Devices), len(c.Regions()), speed/1e12, GiB(mem))
	model = fmt.Sprintf("%d layers, batch %d, %s schedule, needs %s", len(m.Layers), m.Batch, sched, GiB(need))
	return cluster, model
}

// WriteText prints each asked strategy's per-stage table, prediction and
// notes, then a summary table of every strategy run.
func (rep PlanReport) WriteText(w io.Writer) error {
	cmp, obj := rep.Results, rep.Objective
	cd, md := describe(rep.Cluster, rep.Model)
	fmt.Fprintf(w, "cluster %s: %s\nmodel %s: %s\nobjective %s\n", rep.ClusterName, cd, rep.ModelName, md, obj)
	for _, o := range cmp.Asked() {
		fmt.Fprintf(w, "\n== %s ==\n", o.Strategy)
		if o.Err != nil {
			fmt.Fprintf(w, "FAILED: %v\n", o.Err)
			continue
		}
		if err := WriteTable(w, o.Result.Report); err != nil {
			return err
		}
		fmt.Fprintf(w, "predicted %s %.4f s, solve %s", obj, o.Result.Predicted, formatDuration(o.Result.SolveTime))
		if s := o.SpeedupOnEven; s > 0 {
			fmt.Fprintf(w, ", %.2f× over even", s)
		}
		if o.Result.Proven {
			fmt.Fprint(w, ", proven optimal for the bottleneck")
		}
		fmt.Fprintln(w)
		for _, n := range o.Result.Notes {
			fmt.Fprintf(w, "note: %s\n", n)
		}
	}

	fmt.Fprintln(w, "\nsummary")
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "STRATEGY\tITERATION s\tBOTTLENECK s\tSPEEDUP\tSOLVE\tSTAGES\tMEMORY\t")
	for _, o := range cmp {
		name := o.Strategy
		if o.BaselineOnly {
			name += " (baseline)"
		}
		if o.Err != nil {
			fmt.Fprintf(tw, "%s\tfailed\t\t\t\t\t%s\t\n", name, failureKind(o.Err))
			continue
		}
		r := o.Result
		sp := "-"
		if s := o.SpeedupOnEven; s > 0 {
			sp = fmt.Sprintf("%.2f×", s)
		}
		memory := "fits"
		if !r.Report.Feasible() {
			memory = "OVER by " + GiB(r.Report.OverMemBytes)
		}
		fmt.Fprintf(tw, "%s\t%.4f\t%.4f\t%s\t%s\t%d\t%s\t\n", name, r.Report.Iteration, r.Report.Bottleneck, sp,
			formatDuration(r.SolveTime), len(r.Plan.Stages), memory)
	}
	return tw.Flush()
}

// failureKind is a short label of a strategy's error for the summary.
func failureKind(err error) string {
	var me *MemoryError
	if errors.As(err, &me) {
		return "short by " + GiB(me.Missing)
	}
	return "error"
}

func formatDuration(d time.Duration) string {
	switch {
	case d < time.Millisecond:
		return fmt.Sprintf("%.0fµs", float64(d)/float64(time.Microsecond))
	case d < time.Second:
		return fmt.Sprintf("%.1fms", float64(d)/float64(time.Millisecond))
	}
	return fmt.Sprintf("%.2fs", d.Seconds())
}

// The JSON form of a PlanReport (WriteJSON, skyhive plan --json).
type (
	// PlanJSON is the whole report: the problem, every strategy run and
	// the failures.
	PlanJSON struct {
		Cluster      string           `json:"cluster"`
		Model        string           `json:"model"`
		Devices      int              `json:"devices"`
		Layers       int              `json:"layers"`
		Batch        int              `json:"batch"`
		MicroBatches int              `json:"micro_batches"`
		Objective    string           `json:"objective"`
		Results      []PlanResultJSON `json:"results"`
		Errors       []PlanErrorJSON  `json:"errors,omitempty"`
	}
	// PlanResultJSON is one strategy's plan and prediction.
	PlanResultJSON struct {
		Strategy      string          `json:"strategy"`
		Baseline      bool            `json:"baseline_only,omitempty"`
		Predicted     float64         `json:"predicted_s"`
		Iteration     float64         `json:"iteration_s"`
		Sequential    float64         `json:"sequential_s"`
		Pipelined     float64         `json:"pipelined_s"`
		Bottleneck    float64         `json:"bottleneck_s"`
		SpeedupOnEven float64         `json:"speedup_vs_even,omitempty"`
		SolveSeconds  float64         `json:"solve_s"`
		Proven        bool            `json:"proven,omitempty"`
		Gap           float64         `json:"gap,omitempty"`
		Feasible      bool            `json:"feasible"`
		OverMemBytes  int64           `json:"over_mem_bytes,omitempty"`
		Notes         []string        `json:"notes,omitempty"`
		Stages        []PlanStageJSON `json:"stages"`
	}
	// PlanStageJSON is one stage of a plan.
	PlanStageJSON struct {
		Device      int     `json:"device"`
		DeviceName  string  `json:"device_name"`
		First       int     `json:"first"`
		Last        int     `json:"last"`
		Compute     float64 `json:"compute_s"`
		Comm        float64 `json:"comm_s"`
		MemBytes    int64   `json:"mem_bytes"`
		MemCapBytes int64   `json:"mem_cap_bytes"`
	}
	// PlanErrorJSON is a strategy that failed.
	PlanErrorJSON struct {
		Strategy     string `json:"strategy"`
		Error        string `json:"error"`
		MissingBytes int64  `json:"missing_bytes,omitempty"`
	}
)

// WriteJSON prints the report as one indented JSON object.
func (rep PlanReport) WriteJSON(w io.Writer) error {
	c, m, cmp := rep.Cluster, rep.Model, rep.Results
	out := PlanJSON{
		Cluster: rep.ClusterName, Model: rep.ModelName, Devices: len(c.Devices), Layers: len(m.Layers),
		Batch: m.Batch, MicroBatches: m.Micro(), Objective: rep.Objective.String(),
		Results: []PlanResultJSON{},
	}
	for _, o := range cmp {
		if o.Err != nil {
			e := PlanErrorJSON{Strategy: o.Strategy, Error: o.Err.Error()}
			var me *MemoryError
			if errors.As(o.Err, &me) {
				e.MissingBytes = me.Missing
			}
			out.Errors = append(out.Errors, e)
			continue
		}
		r := o.Result
		pr := PlanResultJSON{
			Strategy: o.Strategy, Baseline: o.BaselineOnly, Predicted: r.Predicted,
			Iteration: r.Report.Iteration, Sequential: r.Report.Sequential, Pipelined: r.Report.Pipelined,
			Bottleneck: r.Report.Bottleneck, SpeedupOnEven: o.SpeedupOnEven, SolveSeconds: r.SolveTime.Seconds(),
			Proven: r.Proven, Gap: r.Gap, Feasible: r.Report.Feasible(), OverMemBytes: r.Report.OverMemBytes,
			Notes: r.Notes, Stages: []PlanStageJSON{},
		}
		for _, s := range r.Report.Stages {
			pr.Stages = append(pr.Stages, PlanStageJSON{Device: s.Device, DeviceName: s.DeviceName, First: s.First, Last: s.Last,
				Compute: s.Compute, Comm: s.Comm, MemBytes: s.MemBytes, MemCapBytes: s.MemCap})
		}
		out.Results = append(out.Results, pr)
	}
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(out)
}
