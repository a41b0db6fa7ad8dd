package alloc

import (
	"fmt"
	"io"
	"text/tabwriter"
)

// WriteTable prints a plan's per-stage breakdown: device, layers, compute
// and communication seconds, memory used and capacity, then the totals.
func WriteTable(w io.Writer, r *Report) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "STAGE\tDEVICE\tLAYERS\tCOMPUTE s\tCOMM s\tMEM GiB\tCAP GiB\t")
	for k, s := range r.Stages {
		flag := ""
		if s.MemBytes > s.MemCap {
			flag = " OVER"
		}
		fmt.Fprintf(tw, "%d\t%s\t[%d,%d)\t%.4f\t%.4f\t%.2f\t%.2f%s\t\n", k, s.DeviceName, s.First, s.Last,
			s.Compute, s.Comm, float64(s.MemBytes)/(1<<30), float64(s.MemCap)/(1<<30), flag)
	}
	if err := tw.Flush(); err != nil {
		return fmt.Errorf("alloc: write table: %w", err)
	}
	_, err := fmt.Fprintf(w, "sequential %.4f s  pipelined(M=%d) %.4f s  bottleneck %.4f s  stages %d",
		r.Sequential, r.MicroBatches, r.Pipelined, r.Bottleneck, len(r.Stages))
	if err == nil && r.OverMemBytes > 0 {
		_, err = fmt.Fprintf(w, "  OVER MEMORY by %s", GiB(r.OverMemBytes))
	}
	if err == nil {
		_, err = fmt.Fprintln(w)
	}
	if err != nil {
		return fmt.Errorf("alloc: write table: %w", err)
	}
	return nil
}
