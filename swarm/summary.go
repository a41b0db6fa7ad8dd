package swarm

import (
	"cmp"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/skyhive/skyhive/chart"
)

// SummaryFile is the chart Run writes into its directory.
const SummaryFile = "summary.png"

// maxLabelEvents bounds the events listed under one peer's bars.
const maxLabelEvents = 3

// WriteSummaryPNG draws a run as a bar chart at path (atomically): per
// peer, the MB it sent and received through the namespace router or,
// without namespaces (no bytes counted), the test accuracy of the peers
// that report one, or else how often each peer started. Under each peer's
// bars: its name, role, state and test accuracy, and the failure
// schedule's events that hit it, with the time they fired.
func WriteSummaryPNG(path string, r *RunResult) error {
	if r == nil || len(r.Peers) == 0 {
		return errors.New("swarm: summary: no peers")
	}
	events := map[string][]Event{}
	for _, e := range r.Events {
		events[e.Peer] = append(events[e.Peer], e)
	}
	var bytes, accuracy bool
	for _, p := range r.Peers {
		bytes = bytes || p.Sent+p.Received > 0
		accuracy = accuracy || p.TestAccuracy != nil
	}
	b := chart.Bars{Groups: make([]string, len(r.Peers))}
	sent := chart.BarSeries{Name: "MB sent", Values: make([]float64, len(r.Peers))}
	recv := chart.BarSeries{Name: "MB received", Values: make([]float64, len(r.Peers))}
	acc := chart.BarSeries{Name: "test accuracy (%)", Values: make([]float64, len(r.Peers))}
	starts := chart.BarSeries{Name: "starts", Values: make([]float64, len(r.Peers))}
	for i, p := range r.Peers {
		sent.Values[i], recv.Values[i] = float64(p.Sent)/1e6, float64(p.Received)/1e6
		starts.Values[i] = float64(p.Starts)
		b.Groups[i] = peerLabel(p, events[p.Name])
		if p.TestAccuracy != nil {
			acc.Values[i] = 100 * *p.TestAccuracy
		}
	}
	switch {
	case bytes:
		b.Series, b.YLabel = []chart.BarSeries{sent, recv}, "MB through the router"
	case accuracy:
		b.Series, b.YLabel = []chart.BarSeries{acc}, "test accuracy (%)"
	default:
		b.Series, b.YLabel = []chart.BarSeries{starts}, "starts"
	}
	b.Title = fmt.Sprintf("swarm %s: %d peers, %.1f s, isolation %s", cmp.Or(r.Name, "(unnamed)"), len(r.Peers), r.Seconds, r.Isolation)
	if n := len(r.Events); n > 0 {
		b.Title += fmt.Sprintf(", %d failure events", n)
	}
	if r.TimedOut {
		b.Title += " (timed out)"
	}
	// Room above the highest bar for the legend (top right).
	top := 0.0
	for _, s := range b.Series {
		for _, v := range s.Values {
			top = max(top, v)
		}
	}
	b.YMax = 1.25 * top
	width := min(max(6, 1.1*float64(len(r.Peers))), 40)
	return chart.WriteBarsPNG(path, b, width, 5)
}

// peerLabel is the text under a peer's bars.
func peerLabel(p PeerResult, events []Event) string {
	lines := []string{p.Name, p.Role, p.State}
	if p.Region != "" {
		lines[1] += " " + p.Region
	}
	if p.NAT {
		lines[1] += " (NAT)"
	}
	if p.TestAccuracy != nil {
		lines = append(lines, fmt.Sprintf("acc %.1f%%", 100**p.TestAccuracy))
	}
	for i, e := range events {
		if i == maxLabelEvents {
			lines = append(lines, fmt.Sprintf("+%d more", len(events)-i))
			break
		}
		l := fmt.Sprintf("%s %v", e.Action, e.Fired.Round(100*time.Millisecond))
		if e.Factor != 0 {
			l = fmt.Sprintf("%s x%g %v", e.Action, e.Factor, e.Fired.Round(100*time.Millisecond))
		}
		if e.Error != "" {
			l += " (failed)"
		}
		lines = append(lines, l)
	}
	return strings.Join(lines, "\n")
}
