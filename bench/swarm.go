package bench

import (
	"encoding/json"
	"fmt"
	"io"
	"strings"

	"github.com/skyhive/skyhive/jsonl"
	"github.com/skyhive/skyhive/stats"
	"github.com/skyhive/skyhive/swarm"
)

// SwarmResults turns a swarm run into the benchmark protocol's lines
// (suite "swarm", case the spec's name): wall time, the training peers'
// test accuracy (median, min, max) and how many finished, bytes per peer
// through the emulated network, and, when the pipeline coordinator
// compared plans (train pipeline --compare), the measured iteration time
// of its strategy against "even".
func SwarmResults(r *swarm.RunResult) []Result {
	name := r.Name
	if name == "" {
		name = "swarm"
	}
	line := func(metric string, v float64, unit string) Result {
		return Result{Suite: "swarm", Case: name, Metric: metric, Value: v, Unit: unit}
	}
	// spread is the median of xs with its min and max.
	spread := func(metric string, xs []float64, unit, note string) Result {
		s := stats.Summarize(xs)
		r := line(metric, s.Median, unit)
		r.Min, r.Max, r.Note = s.Min, s.Max, note
		return r
	}
	out := []Result{line("seconds", r.Seconds, "s")}
	var acc []float64
	training, finished := 0, 0
	var bytes []float64
	for _, p := range r.Peers {
		if p.Sent+p.Received > 0 {
			bytes = append(bytes, float64(p.Sent+p.Received)/1e6)
		}
		if swarm.IsService(p.Role) {
			continue
		}
		training++
		if p.TestAccuracy != nil {
			finished++
			acc = append(acc, *p.TestAccuracy)
		}
	}
	if len(acc) > 0 {
		out = append(out, spread("test_accuracy", acc, "fraction", "median over the training peers that finished"))
	}
	fin := line("finished", float64(finished), "peers")
	fin.Note = fmt.Sprintf("of %d training peers (killed ones do not finish)", training)
	out = append(out, fin)
	if len(bytes) > 0 {
		out = append(out, spread("bytes_per_peer", bytes, "MB", "IP bytes sent+received through the namespace router"))
	}
	for _, p := range r.Peers {
		if p.Role == swarm.RoleCoordinator && p.Result != nil {
			out = append(out, comparedPlans(name, p.Result)...)
		}
	}
	return out
}

// comparedPlans reads a pipeline result's "compare" entries: each
// strategy's measured median iteration against even's.
func comparedPlans(name string, raw json.RawMessage) []Result {
	var res struct {
		Compare []struct {
			Strategy string    `json:"strategy"`
			Median   float64   `json:"measured_seconds"`
			Times    []float64 `json:"times"`
		} `json:"compare"`
		Config struct {
			Strategy string `json:"strategy"`
		} `json:"config"`
	}
	if json.Unmarshal(raw, &res) != nil {
		return nil
	}
	even := 0.0
	for _, c := range res.Compare {
		if c.Strategy == "even" {
			even = c.Median
		}
	}
	var out []Result
	for _, c := range res.Compare {
		if c.Strategy == "even" || len(c.Times) == 0 {
			continue
		}
		s := stats.Summarize(c.Times)
		r := Result{Suite: "swarm", Case: name, Metric: "iteration_" + strings.ReplaceAll(c.Strategy, "-", "_"), Value: s.Median, Unit: "s", Min: s.Min, Max: s.Max,
			Note: "measured median iteration time of the plan, alternating with the others"}
		if even > 0 {
			r = r.WithBaseline("even", even)
		}
		out = append(out, r)
	}
	return out
}

// WriteSwarm writes a swarm run to w: with asJSON the benchmark protocol's
// lines (SwarmResults, a JSON object each), else the run as text
// (RunResult.WriteText) with its benchmark numbers.
func WriteSwarm(w io.Writer, r *swarm.RunResult, asJSON bool) {
	results := SwarmResults(r)
	if asJSON {
		lines := &jsonl.Writer{W: w}
		for _, b := range results {
			lines.Write(b)
		}
		return
	}
	var numbers []string
	for _, b := range results[1:] {
		line := fmt.Sprintf("%s: %.4g %s", b.Metric, b.Value, b.Unit)
		if b.Baseline != "" {
			line += fmt.Sprintf(" (%s %.4g, ratio %.2f)", b.Baseline, b.BaselineValue, b.Ratio)
		}
		numbers = append(numbers, line)
	}
	r.WriteText(w, numbers)
}
