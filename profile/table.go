package profile

import (
	"fmt"
	"io"
	"text/tabwriter"
)

// WriteDevice prints a device profile: speed, memory and the per-shape GEMM
// measurements.
func WriteDevice(w io.Writer, d Device) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "device\t%s\n", d.Name)
	if d.Region != "" {
		fmt.Fprintf(tw, "region\t%s\n", d.Region)
	}
	if d.Peer != "" {
		fmt.Fprintf(tw, "peer\t%s\n", d.Peer)
	}
	fmt.Fprintf(tw, "backend\t%s on %d CPUs\n", d.Backend, d.CPUs)
	fmt.Fprintf(tw, "speed\t%.1f GFLOP/s", d.Speed/1e9)
	if d.Slowdown > 1 || (d.Slowdown > 0 && d.Slowdown < 1) {
		fmt.Fprintf(tw, " (measured %.1f GFLOP/s, slowdown %.3g)", d.MeasuredSpeed/1e9, d.Slowdown)
	}
	fmt.Fprintln(tw)
	fmt.Fprintf(tw, "memory\t%s", fmtBytes(d.MemBytes))
	if d.MemCapBytes > 0 {
		fmt.Fprintf(tw, " (available %s, cap %s)", fmtBytes(d.MemAvailableBytes), fmtBytes(d.MemCapBytes))
	}
	fmt.Fprintln(tw)
	if len(d.Gemm) > 0 {
		fmt.Fprintln(tw, "\nGEMM\tGFLOP\tmedian ms\tmin ms\tmax ms\tGFLOP/s")
		for _, g := range d.Gemm {
			fmt.Fprintf(tw, "%s\t%.2f\t%.2f\t%.2f\t%.2f\t%.1f\n", g.GemmShape, g.FLOPs()/1e9,
				1e3*g.Seconds, 1e3*g.MinSeconds, 1e3*g.MaxSeconds, g.FLOPS/1e9)
		}
	}
	return tw.Flush()
}

// WriteModel prints a model profile, one line per layer and a total.
// Measured times, if any, get their own columns and the achieved GFLOP/s.
func WriteModel(w io.Writer, m *ModelProfile) error {
	measured := m.Measured()
	fmt.Fprintf(w, "model %s, batch %d, input %v, %d layers\n", m.Name, m.Batch, m.InShape, len(m.Layers))
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprint(tw, "layer\tfwd GFLOP\tbwd GFLOP\tparams\tparam MiB\tact MiB\tout MiB\tout shape\t")
	if measured {
		fmt.Fprint(tw, "fwd ms\tbwd ms\tGFLOP/s\t")
	}
	fmt.Fprintln(tw)
	row := func(l Layer, shape string) {
		fmt.Fprintf(tw, "%s\t%.3f\t%.3f\t%d\t%.2f\t%.2f\t%.2f\t%s\t", l.Name, l.FwdFLOPs/1e9, l.BwdFLOPs/1e9,
			l.Params, mib(l.ParamBytes), mib(l.ActivationBytes), mib(l.OutputBytes), shape)
		if measured {
			gf := 0.0
			if t := l.FwdSeconds + l.BwdSeconds; t > 0 {
				gf = (l.FwdFLOPs + l.BwdFLOPs) / t / 1e9
			}
			fmt.Fprintf(tw, "%.2f\t%.2f\t%.1f\t", 1e3*l.FwdSeconds, 1e3*l.BwdSeconds, gf)
		}
		fmt.Fprintln(tw)
	}
	for _, l := range m.Layers {
		row(l, fmt.Sprint(l.OutShape))
	}
	row(m.Totals(), "")
	if err := tw.Flush(); err != nil {
		return err
	}
	if measured {
		_, err := fmt.Fprintf(w, "measured with %s on %d CPUs; training memory (4×params + activations): %s\n",
			m.Backend, m.CPUs, fmtBytes(trainingMem(m)))
		return err
	}
	_, err := fmt.Fprintf(w, "training memory (4×params + activations): %s\n", fmtBytes(trainingMem(m)))
	return err
}

// WriteLinks prints measured links.
func WriteLinks(w io.Writer, links []Link) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "from\tto\tlatency ms\trtt min ms\trtt max ms\tMB/s")
	for _, l := range links {
		fmt.Fprintf(tw, "%s\t%s\t%.3f\t%.3f\t%.3f\t%.1f\n", short(l.From), short(l.To),
			1e3*l.Latency, 1e3*l.RTTMin, 1e3*l.RTTMax, l.Bandwidth/1e6)
	}
	return tw.Flush()
}

// trainingMem is what alloc charges for the whole model.
func trainingMem(m *ModelProfile) int64 {
	var s int64
	for _, l := range m.Layers {
		s += l.Alloc().MemBytes()
	}
	return s
}

func mib(b int64) float64 { return float64(b) / (1 << 20) }

// fmtBytes formats a byte count in MiB or GiB.
func fmtBytes(b int64) string {
	if b >= 1<<30 {
		return fmt.Sprintf("%.2f GiB", float64(b)/(1<<30))
	}
	return fmt.Sprintf("%.1f MiB", mib(b))
}

// short abbreviates long peer IDs for tables.
func short(id string) string {
	if len(id) > 16 {
		return id[:6] + "…" + id[len(id)-6:]
	}
	return id
}
