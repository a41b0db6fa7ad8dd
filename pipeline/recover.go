package pipeline

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/skyhive/skyhive/alloc"
	"github.com/skyhive/skyhive/wire"
)

// recover handles a failed iteration: it stops the others, finds the dead
// workers and re-plans on the live ones.
func (s *Session) recover(ctx context.Context, cause error) error {
	fmt.Fprintf(s.cfg.Log, "%s recovering from: %v\n", time.Now().Format("15:04:05.000"), cause)
	var wg sync.WaitGroup
	for _, a := range s.stages {
		wg.Go(func() {
			cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
			defer cancel()
			s.c.call(cctx, a.worker, ProtoAbort, abortReq{Gen: s.gen, Iter: s.iter}, nil, nil, wire.Limits{})
		})
	}
	wg.Wait()
	for _, w := range s.c.Workers() {
		if !w.Alive {
			continue
		}
		wg.Go(func() {
			if err := s.c.ping(ctx, w.Index, 3*time.Second); err != nil && ctx.Err() == nil {
				s.c.markDead(w.Index)
			}
		})
	}
	wg.Wait()
	// Even on the same plan, the stages are installed anew: the new
	// generation drops the failed attempt's abort and activations, so
	// the batch can be retried.
	_, err := s.replan(ctx, "failure", true)
	return err
}

// samePlan reports whether plan (worker indices) is the running plan and
// all its workers are alive.
func (s *Session) samePlan(plan alloc.Plan) bool {
	if len(plan.Stages) != len(s.stages) {
		return false
	}
	for k, st := range plan.Stages {
		a := s.stages[k]
		if st.Device != a.worker || st.First != a.first || st.Last != a.last || !s.c.worker(a.worker).alive(s.c) {
			return false
		}
	}
	return true
}

// replan gathers the state, profiles newcomers, solves the allocation
// on the live workers and installs the result: only if it differs from
// the running plan, unless force is set.
func (s *Session) replan(ctx context.Context, reason string, force bool) (changed bool, err error) {
	for attempt := 0; ; attempt++ {
		snap, err := s.gather(ctx)
		if err != nil {
			return false, err
		}
		if err := s.profile(ctx); err != nil {
			return false, err
		}
		plan, err := s.choosePlan(ctx, s.cfg.Strategy, nil)
		if err != nil {
			return false, err
		}
		if !force && s.samePlan(plan) {
			// Only the speeds changed: keep the layers where they are and
			// measure new baselines.
			fmt.Fprintf(s.cfg.Log, "%s plan unchanged at iteration %d (%s)\n", time.Now().Format("15:04:05.000"), s.iter, reason)
			planned := make([]float64, len(s.stages))
			for k, a := range s.stages {
				planned[k] = s.c.worker(a.worker).speed(s.c)
			}
			s.drift.reset(planned)
			return false, nil
		}
		fmt.Fprintf(s.cfg.Log, "%s re-planned at iteration %d (%s)\n", time.Now().Format("15:04:05.000"), s.iter, reason)
		err = s.apply(ctx, plan, snap)
		if err == nil {
			if s.c.m != nil {
				s.c.m.replanned(force)
			}
			return true, nil
		}
		var se *stageError
		if attempt >= s.cfg.MaxRecoveries || !errors.As(err, &se) || ctx.Err() != nil {
			return false, err
		}
		if perr := s.c.ping(ctx, se.worker, 3*time.Second); perr == nil {
			return false, err // a live worker refused its stage (e.g. memory)
		}
		s.c.markDead(se.worker)
	}
}
