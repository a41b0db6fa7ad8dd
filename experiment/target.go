package experiment

import (
	"fmt"
	"slices"
	"strings"
)

// targetResult is one of an issue's targets and whether the runs met it.
type targetResult struct {
	Name  string `json:"name"`
	Claim string `json:"claim"`
	// Evaluated is false when a run the target compares was not made.
	Evaluated bool               `json:"evaluated"`
	Met       bool               `json:"met"`
	Values    map[string]float64 `json:"values,omitempty"`
	Note      string             `json:"note,omitempty"`
}

// verdict is the target's outcome in a word or two.
func (t targetResult) verdict() string {
	switch {
	case !t.Evaluated:
		return "not evaluated"
	case t.Met:
		return "met"
	}
	return "MISSED"
}

// logTargets writes one line per target.
func logTargets(o Options, targets []targetResult) {
	for _, t := range targets {
		o.Logf("  target %s: %s — %s %s %s", t.Name, t.verdict(), t.Claim, fmtValues(t.Values), t.Note)
	}
}

// fmtValues prints a target's values in a stable order.
func fmtValues(v map[string]float64) string {
	if len(v) == 0 {
		return ""
	}
	keys := make([]string, 0, len(v))
	for k := range v {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = fmt.Sprintf("%s=%.4g", k, v[k])
	}
	return "(" + strings.Join(parts, ", ") + ")"
}
