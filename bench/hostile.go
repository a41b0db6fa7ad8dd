package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/skyhive/skyhive/averaging"
	"github.com/skyhive/skyhive/averaging/optimizer"
	"github.com/skyhive/skyhive/hostile"
	"github.com/skyhive/skyhive/moe/client"
	"github.com/skyhive/skyhive/moe/server"
	"github.com/skyhive/skyhive/nn"
	"github.com/skyhive/skyhive/optim"
	"github.com/skyhive/skyhive/p2p"
	"github.com/skyhive/skyhive/tensor"
)

// hostileConfig sizes the hostile suite.
type hostileConfig struct {
	// Expert server: one FFN expert of Hidden, called with Batch rows by
	// one honest client; the server accepts up to MaxBatch rows.
	Hidden, Batch, MaxBatch int
	// Averaging group: Members averagers all-reducing VecLen float32.
	Members, VecLen int
	// The attacker: Identities hosts, Rate requests/s, at most
	// MaxInflight awaiting their verdicts.
	Identities, MaxInflight int
	Rate                    float64
	// Rounds of a no-attack phase, a phase with the flood at a decoy and
	// an attack phase, each measured for Phase after an unmeasured Settle;
	// one unmeasured warm-up phase first.
	Rounds        int
	Phase, Settle time.Duration
}

// hostileMaxSessions is the victims' averaging.Config.MaxSessions.
const hostileMaxSessions = 4096

func hostileDefaults(o Options) hostileConfig {
	c := hostileConfig{Hidden: 1024, Batch: 64, MaxBatch: 1024, Members: 4, VecLen: 1 << 20,
		Identities: 4, MaxInflight: 1024, Rate: 400, Rounds: max(o.Reps, 5), Phase: 3 * time.Second, Settle: 500 * time.Millisecond}
	if o.Quick {
		c.VecLen = 1 << 18
		c.Rounds, c.Phase, c.Settle = 3, time.Second, 200*time.Millisecond
	}
	return c
}

func hostileSuite() Suite {
	return Suite{
		Name: "hostile",
		Short: "honest throughput of an expert server (FFN hidden 1024, batch 64), of a 4-peer averaging group and of a DHT node's declarations over libp2p loopback " +
			"while a hostile peer floods them at 400 requests/s (the DHT: crowding a key, and slow streams from 16 identities), vs no attack and vs the same flood aimed at a decoy peer",
		Run: func(ctx context.Context, o Options) ([]Result, error) { return runHostile(ctx, o, hostileDefaults(o)) },
	}
}

func runHostile(ctx context.Context, o Options, c hostileConfig) ([]Result, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Minute)
	defer cancel()
	var closers []*p2p.Host
	defer func() {
		for _, h := range closers {
			h.Close()
		}
	}()
	reg := o.registerer()
	newHost := func() (*p2p.Host, error) {
		h, err := p2p.New(ctx, p2p.Config{ListenAddrs: []string{"/ip4/127.0.0.1/tcp/0"}, Metrics: reg})
		if err == nil {
			closers = append(closers, h)
		}
		return h, err
	}
	attackers := make([]*p2p.Host, c.Identities)
	for i := range attackers {
		var err error
		if attackers[i], err = newHost(); err != nil {
			return nil, err
		}
	}
	rs, err := hostileExpert(ctx, o, c, newHost, attackers)
	if err != nil {
		return nil, err
	}
	ra, err := hostileAveraging(ctx, o, c, newHost, attackers)
	if err != nil {
		return nil, err
	}
	rd, err := hostileDHT(ctx, o, c, attackers)
	if err != nil {
		return nil, err
	}
	return slices.Concat(rs, ra, rd), nil
}

// workload is honest work running in the background: progress counts the
// units done, errs the honest calls that failed.
type workload struct {
	progress, errs atomic.Int64
	firstErr       atomic.Value
	// newRound, if set, is called before each round's phases (the
	// warm-up's too).
	newRound func()
}

func (w *workload) fail(err error) {
	w.errs.Add(1)
	w.firstErr.CompareAndSwap(nil, err)
}

// phases are the honest rates measured in each kind of phase.
type phases struct {
	// none: no flood; decoy: the same flood aimed at a decoy peer on the
	// same cores; attacked: the flood aimed at the victims.
	none, decoy, attacked []float64
}

// alternate measures w's rate of progress (units/s) in c.Rounds rounds of
// a phase without attack, a phase with decoy flooding a decoy peer, and a
// phase with flood hitting the victims, after a warm-up phase.
func alternate(ctx context.Context, o Options, name string, c hostileConfig, w *workload, flood, decoy *hostile.Flood) (phases, error) {
	sleep := func(d time.Duration) error {
		select {
		case <-time.After(d):
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	measure := func(f *hostile.Flood) (float64, error) {
		var wg sync.WaitGroup
		fctx, stop := context.WithCancel(ctx)
		defer func() { stop(); wg.Wait() }()
		if f != nil {
			wg.Go(func() { f.Run(fctx) })
		}
		if err := sleep(c.Settle); err != nil {
			return 0, err
		}
		p0, t0 := w.progress.Load(), time.Now()
		if err := sleep(c.Phase); err != nil {
			return 0, err
		}
		return float64(w.progress.Load()-p0) / time.Since(t0).Seconds(), nil
	}
	var p phases
	if w.newRound != nil {
		w.newRound()
	}
	if err := sleep(c.Phase); err != nil { // warm-up
		return p, err
	}
	for r := range c.Rounds {
		if w.newRound != nil {
			w.newRound()
		}
		a, err := measure(nil)
		if err != nil {
			return p, err
		}
		d, err := measure(decoy)
		if err != nil {
			return p, err
		}
		b, err := measure(flood)
		if err != nil {
			return p, err
		}
		p.none, p.decoy, p.attacked = append(p.none, a), append(p.decoy, d), append(p.attacked, b)
		o.Logf("hostile: %s round %d: %.4g/s without attack, %.4g/s with the flood at a decoy, %.4g/s under attack", name, r+1, a, d, b)
	}
	return p, nil
}

// hostileResults reports the honest throughput under attack against no
// attack, the verdicts on the hostile requests and the flood's rate.
func hostileResults(c hostileConfig, name, metric, unit string, p phases, t hostile.FloodTally, victims string) []Result {
	sn, sd, sa := Summarize(p.none), Summarize(p.decoy), Summarize(p.attacked)
	r := Result{Suite: "hostile", Case: name, Metric: metric, Value: sa.Median, Unit: unit, Min: sa.Min, Max: sa.Max,
		Note: fmt.Sprintf("under attack vs no attack, medians of %d alternating phases of %v (no attack: min %.4g max %.4g); target ratio >= 0.8. "+
			"The attacker is paced at a fixed %.0f requests/s (reached %.0f; at most %d in flight, each in its own goroutine) from %d identities, "+
			"so that the CPU it takes is bounded and the same in every attack phase; it runs on the victims' cores, so part of any loss is that CPU: "+
			"the /vs-decoy line compares with the same flood aimed at a decoy peer. %s",
			len(p.attacked), c.Phase, sn.Min, sn.Max, c.Rate, t.Rate, c.MaxInflight, c.Identities, victims)}
	vsDecoy := Result{Suite: "hostile", Case: name + "/vs-decoy", Metric: metric, Value: sa.Median, Unit: unit, Min: sa.Min, Max: sa.Max,
		Note: fmt.Sprintf("control for the CPU an attacker on the same cores takes: under attack vs the same flood aimed at a decoy peer "+
			"(same handlers, same cores, not the victims) in phases alternating with the others (decoy: min %.4g max %.4g). "+
			"This ratio leaves out the attacker's CPU and also the victims' own cost of receiving and refusing; the true robustness lies between the two ratios.",
			sd.Min, sd.Max)}
	refused := Result{Suite: "hostile", Case: name + "/hostile", Metric: "hostile_refused", Value: float64(t.Refused), Unit: "requests",
		Note: fmt.Sprintf("%d sent, %d refused (%d of them held unread because the victim had blocked the identity), %d held past the attacker's 1 s timeout, %d accepted: %s",
			t.Sent, t.Refused, t.Blocked, t.Unanswered, t.Accepted, t.Breakdown())}
	rate := Result{Suite: "hostile", Case: name + "/hostile", Metric: "hostile_rate", Value: t.Rate, Unit: "requests/s",
		Note: fmt.Sprintf("requests/s the flood started while it ran (%d started, %.0f KiB per request on average, %.1f MiB/s of requests with a verdict; "+
			"requests of an identity the victim blocked wait unread in the attacker's own buffers until its 1 s timeout); %d ticks skipped with %d requests in flight",
			t.Launched, float64(t.Bytes)/max(float64(t.Sent), 1)/1024, float64(t.Bytes)/max(t.Seconds, 1e-9)/(1<<20), t.Skipped, c.MaxInflight)}
	return []Result{r.WithBaseline("no_attack", sn.Median), vsDecoy.WithBaseline("flood_at_decoy", sd.Median), refused.WithBaseline("hostile_sent", float64(t.Sent)), rate.WithBaseline("target_rate", c.Rate)}
}

// hostileExpert measures an honest client's forward+backward samples/s on
// an expert server, without attack and while the flood of ExpertAttacks
// hits the same server.
func hostileExpert(ctx context.Context, o Options, c hostileConfig, newHost func() (*p2p.Host, error), attackers []*p2p.Host) ([]Result, error) {
	serve := func(seed uint64) (*p2p.Host, *server.Server, error) {
		h, err := newHost()
		if err != nil {
			return nil, nil, err
		}
		srv, err := server.New(server.Config{Transport: h, Experts: []string{"ffn.0", "ffn.1"}, Hidden: c.Hidden, Seed: seed, MaxBatch: c.MaxBatch,
			Metrics: o.registerer()})
		return h, srv, err
	}
	sh, srv, err := serve(1)
	if err != nil {
		return nil, err
	}
	defer srv.Close()
	// The decoy hosts the same experts, so the decoy flood costs what the
	// real one costs, minus hitting the victim.
	dh, dsrv, err := serve(2)
	if err != nil {
		return nil, err
	}
	defer dsrv.Close()
	ch, err := newHost()
	if err != nil {
		return nil, err
	}
	remote := &client.RemoteExpert{UID: "ffn.0", Peer: sh.AddrInfo(), Transport: ch}
	x := tensor.New(c.Batch, c.Hidden)
	tensor.FillNormal(x.Data, rand.New(rand.NewPCG(1, 1)), 0, 1)
	dy := tensor.New(c.Batch, c.Hidden)
	tensor.FillNormal(dy.Data, rand.New(rand.NewPCG(1, 2)), 0, 0.01)
	var w workload
	wctx, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Go(func() {
		for wctx.Err() == nil {
			_, st, err := remote.Forward(wctx, x)
			if err == nil {
				_, err = remote.Backward(wctx, st, dy)
			}
			switch {
			case err == nil:
				w.progress.Add(int64(c.Batch))
			case wctx.Err() == nil:
				w.fail(err)
			}
		}
	})
	floodAt := func(h *p2p.Host) *hostile.Flood {
		return &hostile.Flood{Hosts: attackers, Attacks: hostile.ExpertAttacks(h.AddrInfo(), "ffn.0", c.Hidden, c.Batch, c.MaxBatch),
			Rate: c.Rate, MaxInflight: c.MaxInflight}
	}
	flood, decoy := floodAt(sh), floodAt(dh)
	name := fmt.Sprintf("expert-server/ffn-h%d-b%d", c.Hidden, c.Batch)
	p, err := alternate(ctx, o, name, c, &w, flood, decoy)
	stop()
	wg.Wait()
	if err != nil {
		return nil, err
	}
	if e, ok := w.firstErr.Load().(error); ok {
		return nil, fmt.Errorf("hostile: honest expert call failed (%d failures): %w", w.errs.Load(), e)
	}
	st := srv.Stats().Experts[0]
	victims := fmt.Sprintf("Honest client: forward+backward of %d rows, 1 call at a time, none failed; the server's expert took %d steps, skipped %d, "+
		"and counted %d forward and %d backward errors (the refused requests).", c.Batch, st.Updates, st.SkippedSteps, st.Forward.Errors, st.Backward.Errors)
	return hostileResults(c, name, "honest_samples_per_s", "samples/s", p, flood.Tally(), victims), nil
}

// hostileAveraging measures the all-reduces per second of a group of
// honest averagers, each also running a WAGMA optimizer's activation
// handler, without attack and while the flood of AveragingAttacks hits
// them.
func hostileAveraging(ctx context.Context, o Options, c hostileConfig, newHost func() (*p2p.Host, error), attackers []*p2p.Host) ([]Result, error) {
	n := c.Members
	g := &avgGroup{}
	defer g.close()
	if err := g.start(o, n, newHost); err != nil {
		return nil, err
	}
	vecs := make([][]float32, n)
	for i := range vecs {
		vecs[i] = make([]float32, c.VecLen)
		tensor.FillNormal(vecs[i], rand.New(rand.NewPCG(uint64(i), 3)), 0, 1)
	}
	dh, err := g.startDecoy(o, newHost)
	if err != nil {
		return nil, err
	}
	wctx, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Go(func() { g.allReduceLoop(wctx, vecs) })
	target := hostile.AveragingTarget{Members: g.members, VecLen: c.VecLen, ChunkElems: g.avgs[0].Config().ChunkElems,
		Session: func() string { return fmt.Sprintf("hb/%d", g.round.Load()) }}
	flood := &hostile.Flood{Hosts: attackers, Attacks: hostile.AveragingAttacks(target), Rate: c.Rate, MaxInflight: c.MaxInflight}
	dtarget := target
	dtarget.Members = make([]averaging.Member, n)
	for i := range dtarget.Members {
		dtarget.Members[i] = averaging.Member{Peer: dh.AddrInfo(), Weight: 1}
	}
	decoy := &hostile.Flood{Hosts: attackers, Attacks: hostile.AveragingAttacks(dtarget), Rate: c.Rate, MaxInflight: c.MaxInflight}
	name := fmt.Sprintf("averaging-group/n%d-%dMiB", n, c.VecLen*4>>20)
	if c.VecLen*4 < 1<<20 {
		name = fmt.Sprintf("averaging-group/n%d-%dKiB", n, c.VecLen*4>>10)
	}
	p, err := alternate(ctx, o, name, c, &g.w, flood, decoy)
	stop()
	wg.Wait()
	if err != nil {
		return nil, err
	}
	if e, ok := g.w.firstErr.Load().(error); ok {
		return nil, fmt.Errorf("hostile: honest all-reduce failed (%d failures): %w", g.w.errs.Load(), e)
	}
	var refusedSessions int64
	var refusedActivations int
	for i := range g.avgs {
		refusedSessions += g.avgs[i].Refused()
		refusedActivations += g.opts[i].Stats().Refused
	}
	victims := fmt.Sprintf("Honest group: %d averagers (default config but MaxSessions %d) all-reducing %d float32 in sessions hb/0, hb/1, ... with a WAGMA optimizer's activation handler each; "+
		"%d all-reduces, none failed, %d with a member missing, failed or rejected; the victims refused %d session announcements over their quotas and %d activations.",
		n, hostileMaxSessions, c.VecLen, g.round.Load(), g.degraded.Load(), refusedSessions, refusedActivations)
	return hostileResults(c, name, "honest_allreduces_per_s", "all-reduces/s", p, flood.Tally(), victims), nil
}

// avgGroup is the honest averaging group of the hostile suite: averagers
// with a WAGMA optimizer each, all-reducing in sessions hb/0, hb/1, ...
type avgGroup struct {
	avgs     []*averaging.Averager
	opts     []*optimizer.Optimizer
	members  []averaging.Member
	closers  []io.Closer // closed in reverse order
	w        workload
	round    atomic.Int64 // all-reduces started
	degraded atomic.Int64 // all-reduces with a member missing, failed or rejected
}

// close closes what the group opened, last opened first.
func (g *avgGroup) close() {
	for _, c := range slices.Backward(g.closers) {
		c.Close()
	}
}

// start creates the n averagers on hosts from newHost and their
// optimizers.
func (g *avgGroup) start(o Options, n int, newHost func() (*p2p.Host, error)) error {
	g.avgs = make([]*averaging.Averager, n)
	g.members = make([]averaging.Member, n)
	for i := range g.avgs {
		h, err := newHost()
		if err != nil {
			return err
		}
		// Finished sessions stay in the table for ReduceWait (15 s), so
		// the default table of 256 caps a peer at about 17 all-reduces/s;
		// the group here runs faster than that. The per-peer quota on
		// pending sessions (4) is the default.
		g.avgs[i] = averaging.New(h, averaging.Config{MaxSessions: hostileMaxSessions})
		g.closers = append(g.closers, g.avgs[i])
		g.members[i] = averaging.Member{Peer: h.AddrInfo(), Weight: 1}
	}
	g.opts = make([]*optimizer.Optimizer, n)
	for i := range g.opts {
		p := &nn.Param{Name: "w", Value: tensor.New(16), Grad: tensor.New(16)}
		var err error
		g.opts[i], err = optimizer.New(g.avgs[i], optim.NewSGD([]*nn.Param{p}, optim.SGDConfig{LR: 0.01}),
			optimizer.Config{Algo: optimizer.WAGMA, Rank: i, Roster: g.members, Metrics: o.registerer()})
		if err != nil {
			return err
		}
		g.closers = append(g.closers, g.opts[i])
	}
	return nil
}

// startDecoy starts the decoy: one more averager with an optimizer,
// standing in for every member of a group of n; its roster is the group's
// with the decoy in place of rank 0. It returns the decoy's host.
func (g *avgGroup) startDecoy(o Options, newHost func() (*p2p.Host, error)) (*p2p.Host, error) {
	dh, err := newHost()
	if err != nil {
		return nil, err
	}
	davg := averaging.New(dh, averaging.Config{MaxSessions: hostileMaxSessions})
	g.closers = append(g.closers, davg)
	droster := append([]averaging.Member{{Peer: dh.AddrInfo(), Weight: 1}}, g.members[1:]...)
	dopt, err := optimizer.New(davg, optim.NewSGD([]*nn.Param{{Name: "w", Value: tensor.New(16), Grad: tensor.New(16)}}, optim.SGDConfig{LR: 0.01}),
		optimizer.Config{Algo: optimizer.WAGMA, Rank: 0, Roster: droster, Metrics: o.registerer()})
	if err != nil {
		return nil, err
	}
	g.closers = append(g.closers, dopt)
	return dh, nil
}

// allReduceLoop all-reduces vecs across the group, one session after
// another, until ctx ends, counting progress and failures in g.w.
func (g *avgGroup) allReduceLoop(ctx context.Context, vecs [][]float32) {
	n := len(g.avgs)
	for ctx.Err() == nil {
		s := averaging.Session{ID: fmt.Sprintf("hb/%d", g.round.Load()), Members: g.members}
		var rwg sync.WaitGroup
		errs := make([]error, n)
		res := make([]averaging.Result, n)
		for i := range g.avgs {
			rwg.Go(func() { res[i], errs[i] = g.avgs[i].AllReduce(ctx, s, vecs[i]) })
		}
		rwg.Wait()
		g.round.Add(1)
		if ctx.Err() != nil {
			return
		}
		if err := errors.Join(errs...); err != nil {
			g.w.fail(err)
			continue
		}
		for _, r := range res {
			if len(r.Failed)+len(r.Missing)+len(r.Rejected) > 0 {
				g.degraded.Add(1)
				break
			}
		}
		g.w.progress.Add(1)
	}
}
