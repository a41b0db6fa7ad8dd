package main

import (
	"fmt"
	"time"

	"github.com/skyhive/skyhive/profile"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

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
			return profile.Output{W: cmd.OutOrStdout(), Log: cmd.ErrOrStderr(), Out: out, JSON: asJSON}.Device(d)
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
	profileOutputFlags(fl, &out, &asJSON)
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
			return profile.Output{W: cmd.OutOrStdout(), Log: cmd.ErrOrStderr(), Out: out, JSON: asJSON}.Model(mp)
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&spec, "model", "mlp", "mlp, bert-tiny, bert-large:N or bert-base:N")
	fl.IntVar(&batch, "batch", 0, "samples per batch (default 128 for mlp and bert-tiny, 32 for BERT)")
	fl.BoolVar(&o.Measure, "measure", false, "time every layer's forward and backward pass")
	fl.IntVar(&o.Reps, "reps", profile.DefaultLayerReps, "timed repetitions per layer with --measure (median reported)")
	fl.Uint64Var(&o.Seed, "seed", 1, "seed of the weights and inputs")
	profileOutputFlags(fl, &out, &asJSON)
	return cmd
}

func newProfileClusterCmd() *cobra.Command {
	var (
		intra, inter         [2]float64 // latency ms, bandwidth Mbit/s
		intraGbit, interGbit float64    // retired flags
		intraLat, interLat   time.Duration
		out                  string
	)
	cmd := &cobra.Command{
		Use:   "cluster DEVICE.json...",
		Short: "Join device profiles into a cluster profile (printed as JSON)",
		Long: `Join device profiles, in pipeline order, into a cluster profile. Links between
devices are the --intra defaults within a region and the --inter defaults across
regions; measured links can be added to the "links" list (docs/profile.md).`,
		Example: `  skyhive profile cluster a.json b.json c.json --inter-latency 40ms --inter-bandwidth 1000 --out cluster.json
  skyhive plan --cluster cluster.json --model bert-large:24`,
		Args: cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if !cmd.Flags().Changed("intra-latency-ms") {
				intra[0] = intraLat.Seconds() * 1e3
			}
			if !cmd.Flags().Changed("inter-latency-ms") {
				inter[0] = interLat.Seconds() * 1e3
			}
			if cmd.Flags().Changed("intra-gbit") {
				intra[1] = intraGbit * 1e3
			}
			if cmd.Flags().Changed("inter-gbit") {
				inter[1] = interGbit * 1e3
			}
			cp, err := profile.JoinDevices(args,
				profile.LinkSpec{Latency: intra[0] / 1e3, Bandwidth: intra[1] * 1e6 / 8},
				profile.LinkSpec{Latency: inter[0] / 1e3, Bandwidth: inter[1] * 1e6 / 8})
			if err != nil {
				return err
			}
			return profile.Output{W: cmd.OutOrStdout(), Log: cmd.ErrOrStderr(), Out: out}.Cluster(cp)
		},
	}
	fl := cmd.Flags()
	fl.DurationVar(&intraLat, "intra-latency", 100*time.Microsecond, "one-way latency within a region")
	fl.Float64Var(&intra[1], "intra-bandwidth", 10000, "bandwidth within a region, Mbit/s (0: unlimited)")
	fl.DurationVar(&interLat, "inter-latency", 50*time.Millisecond, "one-way latency across regions")
	fl.Float64Var(&inter[1], "inter-bandwidth", 1000, "bandwidth across regions, Mbit/s (0: unlimited)")
	fl.Float64Var(&intraGbit, "intra-gbit", 0, "retired: use --intra-bandwidth in Mbit/s")
	fl.Float64Var(&interGbit, "inter-gbit", 0, "retired: use --inter-bandwidth in Mbit/s")
	_ = fl.MarkDeprecated("intra-gbit", "use --intra-bandwidth in Mbit/s (1 Gbit/s = 1000)")
	_ = fl.MarkDeprecated("inter-gbit", "use --inter-bandwidth in Mbit/s (1 Gbit/s = 1000)")
	fl.Float64Var(&intra[0], "intra-latency-ms", 0, "deprecated: use --intra-latency")
	fl.Float64Var(&inter[0], "inter-latency-ms", 0, "deprecated: use --inter-latency")
	_ = fl.MarkDeprecated("intra-latency-ms", "use --intra-latency with a duration, e.g. 100us")
	_ = fl.MarkDeprecated("inter-latency-ms", "use --inter-latency with a duration, e.g. 50ms")
	fl.StringVar(&out, "out", "", "write the profile to this file instead of printing it")
	return cmd
}

// profileOutputFlags registers --out and --json of the profile commands
// that print a table.
func profileOutputFlags(fl *pflag.FlagSet, out *string, asJSON *bool) {
	fl.StringVar(out, "out", "", "also write the profile to this JSON file")
	fl.BoolVar(asJSON, "json", false, "print JSON instead of a table")
}
