package profile

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/skyhive/skyhive/launch"
)

// Plan plans a generator spec on a cluster file with the strategy asked
// for, and refuses bad options naming them.
func TestPlan(t *testing.T) {
	ok := PlanConfig{Cluster: "../examples/cluster-hetero.json", Model: "bert-large:24", Strategy: "even", Objective: "iteration", TimeLimit: time.Second}
	rep, err := Plan(context.Background(), ok)
	if err != nil || rep.Err() != nil || len(rep.Results) != 1 || rep.Results[0].Strategy != "even" {
		t.Fatalf("report %+v, %v", rep, err)
	}
	for _, tc := range []struct {
		edit   func(*PlanConfig)
		fields []string
		text   string
	}{
		{func(c *PlanConfig) { c.TimeLimit = 0 }, []string{"time_limit"}, "must be positive"},
		{func(c *PlanConfig) { c.Strategy = "fastest" }, []string{"strategy"}, `unknown %s "fastest"`},
		{func(c *PlanConfig) { c.Schedule = "1f1b" }, []string{"schedule"}, `unknown %s "1f1b"`},
		{func(c *PlanConfig) { c.Schedule = "gpipe" }, []string{"schedule", "micro_batches"}, "needs"},
		{func(c *PlanConfig) { c.Schedule, c.Micro = "sequential", 4 }, []string{"schedule", "micro_batches"}, "one batch at a time"},
		{func(c *PlanConfig) { c.Batch = -1 }, []string{"batch"}, "must be positive"},
	} {
		c := ok
		tc.edit(&c)
		_, err := Plan(context.Background(), c)
		var fe *launch.FieldError
		if !errors.As(err, &fe) || !slices.Equal(fe.Fields, tc.fields) || !strings.Contains(fe.Text, tc.text) {
			t.Errorf("%+v: got %v, want a field error about %v: %q", c, err, tc.fields, tc.text)
		}
	}
}
