package pipeline

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"time"

	"github.com/skyhive/skyhive/launch"
	"github.com/skyhive/skyhive/swarm"
)

// ScenarioConfig configures a Scenario: a coordinator in this process and
// local `skyhive worker` processes that join it over loopback, each an
// emulated device of its own slowdown.
type ScenarioConfig struct {
	// Coordinator configures the coordinator: its host, the emulated
	// network between the workers and its region, its metrics.
	Coordinator CoordinatorConfig
	// Binary is the skyhive executable the local workers run
	// (os.Executable from the CLI, swarm.Binary elsewhere).
	Binary string
	// Slowdowns has one factor ≥ 1 per local worker to start (none: the
	// scenario has only workers that join from elsewhere).
	Slowdowns []float64
	// MemCaps, if set, has one memory cap in bytes per local worker.
	MemCaps []int64
	// Regions, if set, has one region of Coordinator.Network per local
	// worker.
	Regions []string
	// Worker is every local worker's config (e.g. Steady); the launch sets
	// its join address, name, slowdown, region and memory cap. Env is added
	// to the workers' environment.
	Worker launch.Worker
	Env    []string
	// WorkerOutput receives the workers' stdout and stderr (nil discards
	// them).
	WorkerOutput io.Writer
	// ShutdownTimeout bounds how long Close waits for the workers to
	// acknowledge the coordinator's request to exit (default 10 s); those
	// that have not exited then are stopped with a signal.
	ShutdownTimeout time.Duration
}

// Scenario is a pipeline swarm on this machine: a coordinator, the local
// worker processes it launched, and the sessions started on it. Close
// stops all of them. The methods of one Scenario are safe for concurrent
// use; its sessions, like every Session, are not.
type Scenario struct {
	cfg ScenarioConfig
	c   *Coordinator

	mu       sync.Mutex
	local    *swarm.LocalProcs
	sessions []*Session
	closed   bool
}

// NewScenario starts the coordinator of cfg; Launch starts its local
// workers. Callers that do nothing in between use StartScenario.
func NewScenario(ctx context.Context, cfg ScenarioConfig) (*Scenario, error) {
	if cfg.ShutdownTimeout <= 0 {
		cfg.ShutdownTimeout = 10 * time.Second
	}
	if len(cfg.Slowdowns) > 0 && cfg.Binary == "" {
		return nil, errors.New("pipeline: scenario: local workers need the skyhive binary")
	}
	c, err := NewCoordinator(ctx, cfg.Coordinator)
	if err != nil {
		return nil, err
	}
	return &Scenario{cfg: cfg, c: c}, nil
}

// StartScenario starts the coordinator and the local workers of cfg and
// returns once every worker has registered.
func StartScenario(ctx context.Context, cfg ScenarioConfig) (*Scenario, error) {
	sc, err := NewScenario(ctx, cfg)
	if err != nil {
		return nil, err
	}
	if err := sc.Launch(ctx); err != nil {
		sc.Close()
		return nil, err
	}
	return sc, nil
}

// Launch starts one local worker process per slowdown of the
// configuration, named w0, w1, … and registered in that order, and
// returns once all of them have registered. A scenario launches its
// workers once.
func (sc *Scenario) Launch(ctx context.Context) error {
	sc.mu.Lock()
	defer sc.mu.Unlock()
	switch {
	case sc.closed:
		return errors.New("pipeline: scenario closed")
	case sc.local != nil:
		return errors.New("pipeline: scenario: workers already launched")
	case len(sc.cfg.Slowdowns) == 0:
		return nil
	}
	local, err := swarm.LaunchPipelineWorkers(ctx, sc.c, swarm.PipelineLaunch{
		Binary: sc.cfg.Binary, Slowdowns: sc.cfg.Slowdowns, MemCaps: sc.cfg.MemCaps, Regions: sc.cfg.Regions,
		Worker: sc.cfg.Worker, Env: sc.cfg.Env, Output: sc.cfg.WorkerOutput,
	})
	if err != nil {
		return fmt.Errorf("pipeline: launching local workers: %w", err)
	}
	sc.local = local
	return nil
}

// Coordinator is the scenario's coordinator, for workers that join from
// elsewhere (Coordinator.Addrs, WaitWorkers) and the worker table.
func (sc *Scenario) Coordinator() *Coordinator { return sc.c }

// LocalWorkers is the number of local worker processes launched.
func (sc *Scenario) LocalWorkers() int {
	sc.mu.Lock()
	defer sc.mu.Unlock()
	if sc.local == nil {
		return 0
	}
	return sc.local.Len()
}

// KillWorker ends local worker wI abruptly (SIGKILL), as a crash would,
// and waits for it: a failure drill.
func (sc *Scenario) KillWorker(i int) error {
	sc.mu.Lock()
	local := sc.local
	sc.mu.Unlock()
	if local == nil {
		return fmt.Errorf("pipeline: no local worker w%d", i)
	}
	return local.Kill(i)
}

// Start profiles the workers and the model and returns a session on the
// initial plan (Coordinator.Start); Close closes it.
func (sc *Scenario) Start(ctx context.Context, cfg SessionConfig) (*Session, error) {
	sc.mu.Lock()
	closed := sc.closed
	sc.mu.Unlock()
	if closed {
		return nil, errors.New("pipeline: scenario closed")
	}
	s, err := sc.c.Start(ctx, cfg)
	if err != nil {
		return nil, err
	}
	sc.mu.Lock()
	sc.sessions = append(sc.sessions, s)
	sc.mu.Unlock()
	return s, nil
}

// Close closes the sessions, asks every live worker to exit (within
// ShutdownTimeout), stops and waits for the local worker processes, and
// closes the coordinator. It returns once everything the scenario started
// has ended; later calls do nothing.
func (sc *Scenario) Close() error {
	sc.mu.Lock()
	if sc.closed {
		sc.mu.Unlock()
		return nil
	}
	sc.closed = true
	sessions, local := sc.sessions, sc.local
	sc.sessions = nil
	sc.mu.Unlock()
	for _, s := range sessions {
		s.Close()
	}
	ctx, cancel := context.WithTimeout(context.Background(), sc.cfg.ShutdownTimeout)
	sc.c.Shutdown(ctx)
	cancel()
	if local != nil {
		local.Close()
	}
	return sc.c.Close()
}

// CompareOptions configures Session.Compare.
type CompareOptions struct {
	// Strategies are planned from the session's profiled cluster and
	// predicted, in this order.
	Strategies []string
	// Measure names the strategies whose plans are measured (nil: every
	// one of Strategies that could plan). Measurement.Rounds 0 measures
	// none.
	Measure     []string
	Measurement MeasureOptions
	// Planned, when set, is called after planning, before measuring; an
	// error stops the comparison.
	Planned func(PlanComparisons) error
	// Then names the strategy whose plan the session is left on: the one
	// compared, or a plan solved now if that strategy was not compared or
	// could not plan ("": the last plan measured).
	Then string
}

// Compare plans with every strategy of o and predicts each plan
// (ComparePlans), measures the plans of o.Measure in turn
// (MeasurePlans), then installs o.Then's plan. The entries are in the
// order of o.Strategies; the measured ones have their Times.
func (s *Session) Compare(ctx context.Context, o CompareOptions) (PlanComparisons, error) {
	cmp, err := s.ComparePlans(ctx, o.Strategies)
	if err != nil {
		return nil, err
	}
	if o.Planned != nil {
		if err := o.Planned(cmp); err != nil {
			return cmp, err
		}
	}
	if o.Measurement.Rounds > 0 {
		measured := cmp
		if o.Measure != nil {
			measured = nil
			for _, name := range o.Measure {
				if pc, ok := cmp.Get(name); ok {
					measured = append(measured, pc)
				}
			}
		}
		if err := s.MeasurePlans(ctx, measured, o.Measurement); err != nil {
			return cmp, err
		}
		for _, pc := range measured {
			cmp[cmp.index(pc.Strategy)].Times = pc.Times
		}
	}
	if o.Then == "" {
		return cmp, nil
	}
	pc, ok := cmp.Get(o.Then)
	plan := pc.Plan
	if !ok || pc.Err != nil {
		if plan, err = s.Solve(ctx, o.Then); err != nil {
			return cmp, err
		}
	}
	return cmp, s.SetPlan(ctx, plan)
}
