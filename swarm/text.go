package swarm

import (
	"fmt"
	"io"
	"text/tabwriter"
	"time"
)

// WriteText prints the run as text: its length and isolation, a table of
// the peers (role, region, state, starts, accuracy, MB sent and received),
// the failure schedule's events, numbers (lines the caller computed from
// the run, e.g. its benchmark results) and the router's counts.
func (r *RunResult) WriteText(w io.Writer, numbers []string) {
	fmt.Fprintf(w, "swarm %s: %.1f s, isolation %s\n", r.Name, r.Seconds, r.Isolation)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "peer\trole\tregion\tstate\tstarts\taccuracy\tMB sent\tMB received")
	for _, p := range r.Peers {
		acc := "-"
		if p.TestAccuracy != nil {
			acc = fmt.Sprintf("%.2f%%", 100**p.TestAccuracy)
		}
		region := p.Region
		if p.NAT {
			region += " (NAT)"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%s\t%.1f\t%.1f\n", p.Name, p.Role, region, p.State, p.Starts, acc, float64(p.Sent)/1e6, float64(p.Received)/1e6)
	}
	tw.Flush()
	for _, e := range r.Events {
		line := fmt.Sprintf("  at %v: %s %s", e.Fired.Round(time.Millisecond), e.Action, e.Peer)
		if e.Error != "" {
			line += ": " + e.Error
		}
		fmt.Fprintln(w, line)
	}
	for _, line := range numbers {
		fmt.Fprintf(w, "  %s\n", line)
	}
	if n := r.Network; n != nil {
		fmt.Fprintf(w, "  router: %d packets forwarded, %d lost, %d tail-dropped, %d unreachable, %d refused by NATs\n",
			n.Forwarded, n.Lost, n.QueueDrops, n.Unreachable, n.NATDrops)
	}
}
