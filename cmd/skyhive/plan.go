package main

import (
	"context"
	"encoding/json"
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
	var out []alloc.Strategy
	for _, n := range names {
		s, err := alloc.NewStrategy(n)
		if err != nil {
			return nil, err
		}
		if _, ok := s.(alloc.Optimal); ok {
			s = alloc.Optimal{TimeLimit: f.timeLimit}
		}
		out = append(out, s)
	}
	return out, nil
}

// planOutcome is one strategy's result or failure.
type planOutcome struct {
	name string
	res  *alloc.Result
	err  error
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

	solve := func(s alloc.Strategy) planOutcome {
		sctx, cancel := context.WithTimeout(ctx, f.timeLimit)
		defer cancel()
		r, err := s.Solve(sctx, p)
		return planOutcome{name: s.Name(), res: r, err: err}
	}
	var outs []planOutcome
	for _, s := range strats {
		outs = append(outs, solve(s))
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("plan: %w", err)
		}
	}
	// "even" is the baseline of every speedup: run it even when not asked.
	baseIdx := slices.IndexFunc(outs, func(o planOutcome) bool { return o.name == "even" })
	var base planOutcome
	if baseIdx >= 0 {
		base = outs[baseIdx]
	} else {
		base = solve(alloc.Even{})
	}

	if f.asJSON {
		if err := writePlanJSON(w, f, c, m, obj, outs, base); err != nil {
			return err
		}
	} else if err := writePlanText(w, f, c, m, obj, outs, base, baseIdx < 0); err != nil {
		return err
	}
	return planFailure(outs, base)
}

// planFailure joins the failures of the run into one error, the memory
// shortfall first.
func planFailure(outs []planOutcome, base planOutcome) error {
	var errs []error
	var me *alloc.MemoryError
	if errors.As(base.err, &me) {
		return fmt.Errorf("the cluster cannot hold the model: %w", base.err)
	}
	for _, o := range outs {
		if o.err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", o.name, o.err))
		}
	}
	if len(errs) == 0 {
		return nil
	}
	return fmt.Errorf("plan failed: %w", errors.Join(errs...))
}

// planSpeedup is even's predicted time over r's, or 0 if either is missing.
func planSpeedup(base planOutcome, r *alloc.Result) float64 {
	if base.err != nil || base.res == nil || r == nil || !(r.Predicted > 0) {
		return 0
	}
	return base.res.Predicted / r.Predicted
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

func writePlanText(w io.Writer, f *planFlags, c *alloc.Cluster, m *alloc.Model, obj alloc.Objective, outs []planOutcome, base planOutcome, baseHidden bool) error {
	cd, md := planDescribe(c, m)
	fmt.Fprintf(w, "cluster %s: %s\nmodel %s: %s\nobjective %s\n", f.cluster, cd, f.model, md, obj)
	for _, o := range outs {
		fmt.Fprintf(w, "\n== %s ==\n", o.name)
		if o.err != nil {
			fmt.Fprintf(w, "FAILED: %v\n", o.err)
			continue
		}
		if err := alloc.WriteTable(w, o.res.Report); err != nil {
			return err
		}
		fmt.Fprintf(w, "predicted %s %.4f s, solve %s", obj, o.res.Predicted, planDur(o.res.SolveTime))
		if s := planSpeedup(base, o.res); s > 0 {
			fmt.Fprintf(w, ", %.2f× over even", s)
		}
		if o.res.Proven {
			fmt.Fprint(w, ", proven optimal for the bottleneck")
		}
		fmt.Fprintln(w)
		for _, n := range o.res.Notes {
			fmt.Fprintf(w, "note: %s\n", n)
		}
	}

	fmt.Fprintln(w, "\nsummary")
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "STRATEGY\tITERATION s\tBOTTLENECK s\tSPEEDUP\tSOLVE\tSTAGES\tMEMORY\t")
	rows := outs
	if baseHidden {
		b := base
		b.name = "even (baseline)"
		rows = append([]planOutcome{b}, outs...)
	}
	for _, o := range rows {
		if o.err != nil {
			fmt.Fprintf(tw, "%s\tfailed\t\t\t\t\t%s\t\n", o.name, planFailureKind(o.err))
			continue
		}
		r := o.res
		sp := "-"
		if s := planSpeedup(base, r); s > 0 {
			sp = fmt.Sprintf("%.2f×", s)
		}
		memory := "fits"
		if !r.Report.Feasible() {
			memory = "OVER by " + alloc.GiB(r.Report.OverMemBytes)
		}
		fmt.Fprintf(tw, "%s\t%.4f\t%.4f\t%s\t%s\t%d\t%s\t\n", o.name, r.Report.Iteration, r.Report.Bottleneck, sp,
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

func writePlanJSON(w io.Writer, f *planFlags, c *alloc.Cluster, m *alloc.Model, obj alloc.Objective, outs []planOutcome, base planOutcome) error {
	out := planJSON{
		Cluster: f.cluster, Model: f.model, Devices: len(c.Devices), Layers: len(m.Layers),
		Batch: m.Batch, MicroBatches: m.Micro(), Objective: obj.String(),
		Results: []planResultJSON{},
	}
	add := func(o planOutcome, baselineOnly bool) {
		if o.err != nil {
			e := planErrorJSON{Strategy: o.name, Error: o.err.Error()}
			var me *alloc.MemoryError
			if errors.As(o.err, &me) {
				e.MissingBytes = me.Missing
			}
			out.Errors = append(out.Errors, e)
			return
		}
		r := o.res
		pr := planResultJSON{
			Strategy: o.name, Baseline: baselineOnly, Predicted: r.Predicted,
			Iteration: r.Report.Iteration, Sequential: r.Report.Sequential, Pipelined: r.Report.Pipelined,
			Bottleneck: r.Report.Bottleneck, SpeedupOnEven: planSpeedup(base, r), SolveSeconds: r.SolveTime.Seconds(),
			Proven: r.Proven, Gap: r.Gap, Feasible: r.Report.Feasible(), OverMemBytes: r.Report.OverMemBytes,
			Notes: r.Notes, Stages: []planStageJSON{},
		}
		for _, s := range r.Report.Stages {
			pr.Stages = append(pr.Stages, planStageJSON{Device: s.Device, DeviceName: s.DeviceName, First: s.First, Last: s.Last,
				Compute: s.Compute, Comm: s.Comm, MemBytes: s.MemBytes, MemCapBytes: s.MemCap})
		}
		out.Results = append(out.Results, pr)
	}
	if !slices.ContainsFunc(outs, func(o planOutcome) bool { return o.name == "even" }) {
		add(base, true)
	}
	for _, o := range outs {
		add(o, false)
	}
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(out)
}

func newProfileCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "profile",
		Short: "Measure this device or a model's layers for the allocator",
		Long: `Profiles are what "skyhive plan" and the pipeline plan with (docs/profile.md):
  device   GEMM speed at training shapes and available memory of this machine
  model    per-layer FLOPs, parameters, activation memory, output size, and
           with --measure the forward and backward time of every layer
  cluster  joins device profiles into a cluster profile`,
		Args: cobra.NoArgs,
	}
	cmd.AddCommand(newProfileDeviceCmd(), newProfileModelCmd(), newProfileClusterCmd())
	return cmd
}

func newProfileDeviceCmd() *cobra.Command {
	var (
		o      profile.DeviceOptions
		memGiB float64
		out    string
		asJSON bool
	)
	cmd := &cobra.Command{
		Use:   "device",
		Short: "Benchmark this machine: GEMM speed at training shapes and available memory",
		Example: `  skyhive profile device
  skyhive profile device --name worker-3 --region eu-west --mem-cap-gib 8 --slowdown 2 --out worker-3.json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if memGiB < 0 {
				return fmt.Errorf("--mem-cap-gib must not be negative, got %v", memGiB)
			}
			o.MemCapBytes = int64(memGiB * (1 << 30))
			d, err := profile.MeasureDevice(cmd.Context(), o)
			if err != nil {
				return err
			}
			if out != "" {
				if err := profile.SaveDevice(out, d); err != nil {
					return err
				}
				fmt.Fprintf(cmd.ErrOrStderr(), "wrote %s\n", out)
			}
			if asJSON {
				return profileWriteJSON(cmd.OutOrStdout(), struct {
					Format string `json:"format"`
					profile.Device
				}{profile.DeviceFormat, d})
			}
			return profile.WriteDevice(cmd.OutOrStdout(), d)
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&o.Name, "name", "", "device name (default: the host name)")
	fl.StringVar(&o.Region, "region", "", "network region of the device")
	fl.IntVar(&o.Tokens, "tokens", profile.DefaultTokens, "rows (batch × sequence) of the benchmark GEMMs")
	fl.IntVar(&o.Hidden, "hidden", profile.DefaultHidden, "hidden size of the benchmark GEMMs")
	fl.IntVar(&o.Reps, "reps", profile.DefaultGemmReps, "timed repetitions per GEMM shape (median reported)")
	fl.Float64Var(&memGiB, "mem-cap-gib", 0, "cap the reported memory at this many GiB (0: MemAvailable)")
	fl.Float64Var(&o.Slowdown, "slowdown", 1, "divide the measured speed by this factor (emulated heterogeneity)")
	fl.Uint64Var(&o.Seed, "seed", 1, "seed of the benchmark matrices")
	fl.StringVar(&out, "out", "", "also write the profile to this JSON file")
	fl.BoolVar(&asJSON, "json", false, "print JSON instead of a table")
	return cmd
}

func newProfileModelCmd() *cobra.Command {
	var (
		spec   string
		batch  int
		o      profile.LayerOptions
		out    string
		asJSON bool
	)
	cmd := &cobra.Command{
		Use:   "model",
		Short: "List a model's layers with FLOPs, parameters and memory, optionally timed",
		Example: `  skyhive profile model --model mlp --measure
  skyhive profile model --model bert-large:24 --batch 32 --out bert-large-24.json
  skyhive profile model --model bert-base:12 --batch 8 --measure --json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if batch < 0 {
				return fmt.Errorf("--batch must not be negative, got %d", batch)
			}
			mp, err := profile.ModelLayers(cmd.Context(), spec, batch, o)
			if err != nil {
				return err
			}
			if out != "" {
				if err := profile.Save(out, mp); err != nil {
					return err
				}
				fmt.Fprintf(cmd.ErrOrStderr(), "wrote %s\n", out)
			}
			if asJSON {
				return profileWriteJSON(cmd.OutOrStdout(), mp)
			}
			return profile.WriteModel(cmd.OutOrStdout(), mp)
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&spec, "model", "mlp", "mlp, bert-tiny, bert-large:N or bert-base:N")
	fl.IntVar(&batch, "batch", 0, "samples per batch (default 128 for mlp and bert-tiny, 32 for BERT)")
	fl.BoolVar(&o.Measure, "measure", false, "time every layer's forward and backward pass")
	fl.IntVar(&o.Reps, "reps", profile.DefaultLayerReps, "timed repetitions per layer with --measure (median reported)")
	fl.Uint64Var(&o.Seed, "seed", 1, "seed of the weights and inputs")
	fl.StringVar(&out, "out", "", "also write the profile to this JSON file")
	fl.BoolVar(&asJSON, "json", false, "print JSON instead of a table")
	return cmd
}

func newProfileClusterCmd() *cobra.Command {
	var (
		intra, inter       [2]float64 // latency ms, bandwidth Gbit/s
		intraLat, interLat time.Duration
		out                string
	)
	cmd := &cobra.Command{
		Use:   "cluster DEVICE.json...",
		Short: "Join device profiles into a cluster profile (printed as JSON)",
		Long: `Join device profiles, in pipeline order, into a cluster profile. Links between
devices are the --intra defaults within a region and the --inter defaults across
regions; measured links can be added to the "links" list (docs/profile.md).`,
		Example: `  skyhive profile cluster a.json b.json c.json --inter-latency 40ms --inter-gbit 1 --out cluster.json
  skyhive plan --cluster cluster.json --model bert-large:24`,
		Args: cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if !cmd.Flags().Changed("intra-latency-ms") {
				intra[0] = intraLat.Seconds() * 1e3
			}
			if !cmd.Flags().Changed("inter-latency-ms") {
				inter[0] = interLat.Seconds() * 1e3
			}
			for _, v := range append(intra[:], inter[:]...) {
				if v < 0 {
					return errors.New("link latencies and bandwidths must not be negative")
				}
			}
			cp := &profile.ClusterProfile{
				Format: profile.ClusterFormat,
				Intra:  profile.LinkSpec{Latency: intra[0] / 1e3, Bandwidth: intra[1] * 1e9 / 8},
				Inter:  profile.LinkSpec{Latency: inter[0] / 1e3, Bandwidth: inter[1] * 1e9 / 8},
			}
			for _, a := range args {
				d, err := profile.LoadDevice(a)
				if err != nil {
					return err
				}
				cp.Devices = append(cp.Devices, d)
			}
			if _, err := cp.Alloc(); err != nil {
				return err
			}
			if out != "" {
				if err := profile.Save(out, cp); err != nil {
					return err
				}
				fmt.Fprintf(cmd.ErrOrStderr(), "wrote %s\n", out)
				return nil
			}
			return profileWriteJSON(cmd.OutOrStdout(), cp)
		},
	}
	fl := cmd.Flags()
	fl.DurationVar(&intraLat, "intra-latency", 100*time.Microsecond, "one-way latency within a region")
	fl.Float64Var(&intra[1], "intra-gbit", 10, "bandwidth within a region, Gbit/s (0: unlimited)")
	fl.DurationVar(&interLat, "inter-latency", 50*time.Millisecond, "one-way latency across regions")
	fl.Float64Var(&inter[1], "inter-gbit", 1, "bandwidth across regions, Gbit/s (0: unlimited)")
	fl.Float64Var(&intra[0], "intra-latency-ms", 0, "deprecated: use --intra-latency")
	fl.Float64Var(&inter[0], "inter-latency-ms", 0, "deprecated: use --inter-latency")
	_ = fl.MarkDeprecated("intra-latency-ms", "use --intra-latency with a duration, e.g. 100us")
	_ = fl.MarkDeprecated("inter-latency-ms", "use --inter-latency with a duration, e.g. 50ms")
	fl.StringVar(&out, "out", "", "write the profile to this file instead of printing it")
	return cmd
}

// profileWriteJSON prints v as indented JSON.
func profileWriteJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}
