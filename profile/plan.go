package profile

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/skyhive/skyhive/alloc"
	"github.com/skyhive/skyhive/launch"
)

// PlanConfig says what Plan plans (`skyhive plan`).
type PlanConfig struct {
	// Cluster is a cluster file: an alloc cluster, a cluster profile or a
	// device profile (LoadCluster).
	Cluster string
	// Model is a generator spec (bert-large:N, bert-base:N), an alloc
	// model file or a model profile (LoadModel).
	Model string
	// Strategy is "all" or one of alloc.StrategyNames.
	Strategy string
	// Schedule is sequential, gpipe or "" (the model's own); Micro is the
	// micro-batches of gpipe (above 1, it implies gpipe when Schedule is
	// "").
	Schedule string
	Micro    int
	// Batch is the batch of a generator spec (0: 32).
	Batch int
	// Objective is what skyhive minimises: iteration or bottleneck.
	Objective string
	// TimeLimit bounds each strategy's solve.
	TimeLimit time.Duration
}

// Plan assigns cfg's model to the devices of its cluster with its
// strategies (alloc.Compare) and returns the report, which says how each
// fared (PlanReport.Err: whether each found a plan). Errors about the
// options are *launch.FieldError.
func Plan(ctx context.Context, cfg PlanConfig) (*alloc.PlanReport, error) {
	if cfg.TimeLimit <= 0 {
		return nil, launch.NewFieldError(nil, fmt.Sprintf("%%s must be positive, got %v", cfg.TimeLimit), "time_limit")
	}
	obj, err := alloc.ParseObjective(cfg.Objective)
	if err != nil {
		return nil, err
	}
	c, err := LoadCluster(cfg.Cluster)
	if err != nil {
		return nil, err
	}
	m, err := cfg.loadModel()
	if err != nil {
		return nil, err
	}
	strats, err := cfg.strategies()
	if err != nil {
		return nil, err
	}
	p := alloc.Problem{Cluster: c, Model: m, Objective: obj}
	cmp, err := alloc.Compare(ctx, p, strats, alloc.CompareOptions{TimeLimit: cfg.TimeLimit})
	if err != nil {
		return nil, fmt.Errorf("plan: %w", err)
	}
	return &alloc.PlanReport{ClusterName: cfg.Cluster, ModelName: cfg.Model, Cluster: c, Model: m, Objective: obj, Results: cmp}, nil
}

// loadModel reads the model and applies the batch, the schedule and the
// micro-batches.
func (cfg PlanConfig) loadModel() (*alloc.Model, error) {
	var m *alloc.Model
	var err error
	if cfg.Batch != 0 {
		if cfg.Batch < 0 {
			return nil, launch.NewFieldError(nil, fmt.Sprintf("%%s must be positive, got %d", cfg.Batch), "batch")
		}
		if _, statErr := os.Stat(cfg.Model); statErr == nil {
			return nil, launch.NewFieldError(nil, "%s applies to generator specs, and "+cfg.Model+" is a file (its batch is fixed)", "batch")
		}
		m, err = alloc.GenerateModel(cfg.Model, cfg.Batch, 0)
	} else {
		m, err = LoadModel(cfg.Model)
	}
	if err != nil {
		return nil, err
	}
	if cfg.Micro < 0 {
		return nil, launch.NewFieldError(nil, fmt.Sprintf("%%s must not be negative, got %d", cfg.Micro), "micro_batches")
	}
	switch cfg.Schedule {
	case "":
		if cfg.Micro > 0 {
			m.MicroBatches = cfg.Micro
		}
	case "sequential":
		if cfg.Micro > 1 {
			return nil, launch.NewFieldError(nil, fmt.Sprintf("%%s sequential runs one batch at a time, but %%s is %d", cfg.Micro), "schedule", "micro_batches")
		}
		m.MicroBatches = 1
	case "gpipe":
		if cfg.Micro > 0 {
			m.MicroBatches = cfg.Micro
		}
		if m.MicroBatches < 2 {
			return nil, launch.NewFieldError(nil, "%s gpipe needs %s M with M ≥ 2 (the model does not set it)", "schedule", "micro_batches")
		}
	default:
		return nil, launch.NewFieldError(nil, fmt.Sprintf("unknown %%s %q (want sequential or gpipe)", cfg.Schedule), "schedule")
	}
	return m, nil
}

// strategies returns the strategies to run, by name.
func (cfg PlanConfig) strategies() ([]alloc.Strategy, error) {
	names := alloc.StrategyNames()
	if cfg.Strategy != "all" {
		if !slices.Contains(names, cfg.Strategy) {
			return nil, launch.NewFieldError(nil, fmt.Sprintf("unknown %%s %q (want all or one of %s)", cfg.Strategy, strings.Join(names, ", ")), "strategy")
		}
		names = []string{cfg.Strategy}
	}
	return alloc.Strategies(names, cfg.TimeLimit)
}
