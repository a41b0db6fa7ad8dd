package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/skyhive/skyhive/alloc"
	"github.com/skyhive/skyhive/profile"
	"github.com/spf13/cobra"
)

// planFlags are the options of `skyhive plan`.
type planFlags struct {
	cluster   string
	model     string
	strategy  string
	schedule  string
	micro     int
	batch     int
	objective string
	timeLimit time.Duration
	asJSON    bool
}

func newPlanCmd() *cobra.Command {
	var f planFlags
	cmd := &cobra.Command{
		Use:   "plan",
		Short: "Assign a model's layers to a cluster's devices and predict the iteration time",
		Long: `Plan a pipeline: split a model's layers over the devices of a cluster with one or
all allocation strategies (see docs/alloc.md), print each plan's per-stage table,
its predicted iteration time and solve time, and its speedup over "even".

--cluster takes an alloc cluster file (examples/cluster-*.json), a cluster
profile or a device profile (docs/profile.md). --model takes a generator spec
(bert-large:N, bert-base:N), an alloc model file or a model profile written by
"skyhive profile model --out".

If the cluster cannot hold the model, the command says by how much memory and
exits non-zero; so does any strategy that fails.`,
		Example: `  # Every strategy on 16 devices of four GPU types in one data centre:
  skyhive plan --cluster examples/cluster-hetero.json --model bert-large:160

  # Three regions joined by slow links, GPipe with 32 micro-batches, ours only:
  skyhive plan --cluster examples/cluster-geo.json --model bert-large:160 \
      --schedule gpipe --micro-batches 32 --strategy skyhive

  # Machine-readable, the paper's sequential schedule, optimal given 30 s:
  skyhive plan --cluster examples/cluster-geo.json --model bert-large:160 \
      --schedule sequential --strategy optimal --time-limit 30s --json

  # Plan with layers profiled from package nn:
  skyhive profile model --model bert-large:24 --batch 32 --out model.json
  skyhive plan --cluster examples/cluster-hetero.json --model model.json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error { return f.run(cmd.Context(), cmd.OutOrStdout()) },
	}
	fl := cmd.Flags()
	fl.StringVar(&f.cluster, "cluster", "", "cluster file: alloc cluster JSON, cluster profile or device profile (required)")
	fl.StringVar(&f.model, "model", "bert-large:160", "model: generator spec bert-large:N / bert-base:N, alloc model JSON or model profile")
	fl.StringVar(&f.strategy, "strategy", "all", "all or one of "+strings.Join(alloc.StrategyNames(), ", "))
	fl.StringVar(&f.schedule, "schedule", "", "sequential or gpipe (default: the model's own)")
	fl.IntVar(&f.micro, "micro", 0, "micro-batches of the gpipe schedule (implies gpipe when > 1)")
	renameFlags(fl, map[string]string{"micro-batches": "micro"})
	fl.IntVar(&f.batch, "batch", 0, "batch of a generator spec (default 32)")
	fl.StringVar(&f.objective, "objective", "iteration", "what skyhive minimises: iteration or bottleneck")
	fl.DurationVar(&f.timeLimit, "time-limit", alloc.DefaultOptimalTimeLimit, "time limit of each strategy's solve")
	fl.BoolVar(&f.asJSON, "json", false, "print one JSON object instead of tables")
	if err := cmd.MarkFlagRequired("cluster"); err != nil {
		panic(err) // the flag is defined just above
	}
	return cmd
}

// loadModel reads the model and applies --batch, --schedule and
// --micro-batches.
func (f *planFlags) loadModel() (*alloc.Model, error) {
	var m *alloc.Model
	var err error
	if f.batch != 0 {
		if f.batch < 0 {
			return nil, fmt.Errorf("--batch must be positive, got %d", f.batch)
		}
		if _, statErr := os.Stat(f.model); statErr == nil {
			return nil, fmt.Errorf("--batch applies to generator specs, and %s is a file (its batch is fixed)", f.model)
		}
		m, err = alloc.GenerateModel(f.model, f.batch, 0)
	} else {
		m, err = profile.LoadModel(f.model)
	}
	if err != nil {
		return nil, err
	}
	if f.micro < 0 {
		return nil, fmt.Errorf("--micro-batches must not be negative, got %d", f.micro)
	}
	switch f.schedule {
	case "":
		if f.micro > 0 {
			m.MicroBatches = f.micro
		}
	case "sequential":
		if f.micro > 1 {
			return nil, fmt.Errorf("--schedule sequential runs one batch at a time, but --micro-batches is %d", f.micro)
		}
		m.MicroBatches = 1
	case "gpipe":
		if f.micro > 0 {
			m.MicroBatches = f.micro
		}
		if m.MicroBatches < 2 {
			return nil, errors.New("--schedule gpipe needs --micro-batches M with M ≥ 2 (the model does not set it)")
		}
	default:
		return nil, fmt.Errorf("unknown --schedule %q (want sequential or gpipe)", f.schedule)
	}
	return m, nil
}

// strategies returns the strategies to run, by name.
func (f *planFlags) strategies() ([]alloc.Strategy, error) {
	names := alloc.StrategyNames()
	if f.strategy != "all" {
		if !slices.Contains(names, f.strategy) {
			return nil, fmt.Errorf("unknown --strategy %q (want all or one of %s)", f.strategy, strings.Join(names, ", "))
		}
		names = []string{f.strategy}
	}
	return alloc.Strategies(names, f.timeLimit)
}

func (f *planFlags) run(ctx context.Context, w io.Writer) error {
	if f.timeLimit <= 0 {
		return fmt.Errorf("--time-limit must be positive, got %v", f.timeLimit)
	}
	obj, err := alloc.ParseObjective(f.objective)
	if err != nil {
		return err
	}
	c, err := profile.LoadCluster(f.cluster)
	if err != nil {
		return err
	}
	m, err := f.loadModel()
	if err != nil {
		return err
	}
	strats, err := f.strategies()
	if err != nil {
		return err
	}
	p := alloc.Problem{Cluster: c, Model: m, Objective: obj}
	cmp, err := alloc.Compare(ctx, p, strats, alloc.CompareOptions{TimeLimit: f.timeLimit})
	if err != nil {
		return fmt.Errorf("plan: %w", err)
	}
	if f.asJSON {
		if err := writePlanJSON(w, f, c, m, obj, cmp); err != nil {
			return err
		}
	} else if err := writePlanText(w, f, c, m, obj, cmp); err != nil {
		return err
	}
	return planFailure(cmp)
}

// planFailure joins the failures of the run into one error, the memory
// shortfall first.
func planFailure(cmp alloc.Comparisons) error {
	var errs []error
	var me *alloc.MemoryError
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

// planDescribe summarises the cluster and the model for the text header.
func planDescribe(c *alloc.Cluster, m *alloc.Model) (cluster, model string) {
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
	cluster = fmt.Sprintf("%d devices in %d region(s), %.1f TFLOP/s, %s", len(c.Devices), len(c.Regions()), speed/1e12, alloc.GiB(mem))
	model = fmt.Sprintf("%d layers, batch %d, %s schedule, needs %s", len(m.Layers), m.Batch, sched, alloc.GiB(need))
	return cluster, model
}

func writePlanText(w io.Writer, f *planFlags, c *alloc.Cluster, m *alloc.Model, obj alloc.Objective, cmp alloc.Comparisons) error {
	cd, md := planDescribe(c, m)
	fmt.Fprintf(w, "cluster %s: %s\nmodel %s: %s\nobjective %s\n", f.cluster, cd, f.model, md, obj)
	for _, o := range cmp.Asked() {
		fmt.Fprintf(w, "\n== %s ==\n", o.Strategy)
		if o.Err != nil {
			fmt.Fprintf(w, "FAILED: %v\n", o.Err)
			continue
		}
		if err := alloc.WriteTable(w, o.Result.Report); err != nil {
			return err
		}
		fmt.Fprintf(w, "predicted %s %.4f s, solve %s", obj, o.Result.Predicted, planDur(o.Result.SolveTime))
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
			fmt.Fprintf(tw, "%s\tfailed\t\t\t\t\t%s\t\n", name, planFailureKind(o.Err))
			continue
		}
		r := o.Result
		sp := "-"
		if s := o.SpeedupOnEven; s > 0 {
			sp = fmt.Sprintf("%.2f×", s)
		}
		memory := "fits"
		if !r.Report.Feasible() {
			memory = "OVER by " + alloc.GiB(r.Report.OverMemBytes)
		}
		fmt.Fprintf(tw, "%s\t%.4f\t%.4f\t%s\t%s\t%d\t%s\t\n", name, r.Report.Iteration, r.Report.Bottleneck, sp,
			planDur(r.SolveTime), len(r.Plan.Stages), memory)
	}
	return tw.Flush()
}

// planFailureKind is a short label of a strategy's error for the summary.
func planFailureKind(err error) string {
	var me *alloc.MemoryError
	if errors.As(err, &me) {
		return "short by " + alloc.GiB(me.Missing)
	}
	return "error"
}

func planDur(d time.Duration) string {
	switch {
	case d < time.Millisecond:
		return fmt.Sprintf("%.0fµs", float64(d)/float64(time.Microsecond))
	case d < time.Second:
		return fmt.Sprintf("%.1fms", float64(d)/float64(time.Millisecond))
	}
	return fmt.Sprintf("%.2fs", d.Seconds())
}

// JSON output of `skyhive plan --json`.
type (
	planJSON struct {
		Cluster      string           `json:"cluster"`
		Model        string           `json:"model"`
		Devices      int              `json:"devices"`
		Layers       int              `json:"layers"`
		Batch        int              `json:"batch"`
		MicroBatches int              `json:"micro_batches"`
		Objective    string           `json:"objective"`
		Results      []planResultJSON `json:"results"`
		Errors       []planErrorJSON  `json:"errors,omitempty"`
	}
	planResultJSON struct {
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
		Stages        []planStageJSON `json:"stages"`
	}
	planStageJSON struct {
		Device      int     `json:"device"`
		DeviceName  string  `json:"device_name"`
		First       int     `json:"first"`
		Last        int     `json:"last"`
		Compute     float64 `json:"compute_s"`
		Comm        float64 `json:"comm_s"`
		MemBytes    int64   `json:"mem_bytes"`
		MemCapBytes int64   `json:"mem_cap_bytes"`
	}
	planErrorJSON struct {
		Strategy     string `json:"strategy"`
		Error        string `json:"error"`
		MissingBytes int64  `json:"missing_bytes,omitempty"`
	}
)

func writePlanJSON(w io.Writer, f *planFlags, c *alloc.Cluster, m *alloc.Model, obj alloc.Objective, cmp alloc.Comparisons) error {
	out := planJSON{
		Cluster: f.cluster, Model: f.model, Devices: len(c.Devices), Layers: len(m.Layers),
		Batch: m.Batch, MicroBatches: m.Micro(), Objective: obj.String(),
		Results: []planResultJSON{},
	}
	for _, o := range cmp {
		if o.Err != nil {
			e := planErrorJSON{Strategy: o.Strategy, Error: o.Err.Error()}
			var me *alloc.MemoryError
			if errors.As(o.Err, &me) {
				e.MissingBytes = me.Missing
			}
			out.Errors = append(out.Errors, e)
			continue
		}
		r := o.Result
		pr := planResultJSON{
			Strategy: o.Strategy, Baseline: o.BaselineOnly, Predicted: r.Predicted,
			Iteration: r.Report.Iteration, Sequential: r.Report.Sequential, Pipelined: r.Report.Pipelined,
			Bottleneck: r.Report.Bottleneck, SpeedupOnEven: o.SpeedupOnEven, SolveSeconds: r.SolveTime.Seconds(),
			Proven: r.Proven, Gap: r.Gap, Feasible: r.Report.Feasible(), OverMemBytes: r.Report.OverMemBytes,
			Notes: r.Notes, Stages: []planStageJSON{},
		}
		for _, s := range r.Report.Stages {
			pr.Stages = append(pr.Stages, planStageJSON{Device: s.Device, DeviceName: s.DeviceName, First: s.First, Last: s.Last,
				Compute: s.Compute, Comm: s.Comm, MemBytes: s.MemBytes, MemCapBytes: s.MemCap})
		}
		out.Results = append(out.Results, pr)
	}
	return printJSON(w, out)
}
