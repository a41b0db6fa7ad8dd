// Package swarm launches many Skyhive peers at once—as goroutines in one
// process or as child processes—each with an emulated device (slowdown,
// memory cap, pause gate) and a region in a netem network, injects failures
// on a schedule and aggregates the peers' metrics. See docs/swarm.md.
package swarm

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/skyhive/skyhive/clock"
	"github.com/skyhive/skyhive/netem"
)

// Peer states in the report.
const (
	StatePending = "pending" // not started yet (a late class)
	StateRunning = "running"
	StateExited  = "exited"  // returned or exited with success
	StateFailed  = "failed"  // returned an error or exited non-zero
	StateKilled  = "killed"  // killed by the schedule or Kill
	StateStopped = "stopped" // stopped by Stop
)

// Peer is one member of the swarm. Goroutine peers receive it as their
// environment.
type Peer struct {
	Index  int
	Name   string
	Class  string
	Region string
	// Device is the peer's emulated machine.
	Device *Device
	// Metrics is the peer's metrics sink. For child processes the swarm
	// reads the child's metrics file instead (see Child).
	Metrics *Recorder
	// Network is the swarm's emulated network, nil if the spec has none.
	Network *netem.Network
	// Clock is the swarm's clock (Options.Clock, or the wall clock). The
	// device throttles on it and metrics samples are stamped with it;
	// goroutine peers should sleep on it too, so that a test can drive
	// the whole swarm with a fake clock.
	Clock clock.Clock

	// Role and NAT come from the peer's class (see DeviceClass).
	Role string
	NAT  bool

	launched chan instance // each (re)start's instance, for watch; its capacity is the number of starts planned

	mu      sync.Mutex
	ids     []peer.ID
	inst    instance // the current one; nil before the first start
	state   string
	err     error
	killed  bool
	stopped bool
	starts  int
}

// Starts is how many times the peer was started (more than once after a
// rejoin that restarted it).
func (p *Peer) Starts() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.starts
}

// startsLeft is how many (re)starts the spec's schedule still has for the
// peer: its late start, and rejoins after kills.
func (p *Peer) startsLeft() int { return cap(p.launched) - p.Starts() }

// current returns the peer's running instance, or an error naming why
// there is none.
func (p *Peer) current() (instance, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.inst == nil {
		return nil, fmt.Errorf("swarm: %s has not started yet", p.Name)
	}
	return p.inst, nil
}

// Register assigns a transport identity of this peer (e.g. its libp2p host
// ID) to the peer's region in the network, and lets Kill crash it there
// too. Without a network it only records id.
func (p *Peer) Register(id peer.ID) error {
	if p.Network != nil {
		if err := p.Network.Assign(id, p.Region); err != nil {
			return err
		}
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.ids = append(p.ids, id)
	return nil
}

// State returns the peer's state and the error it ended with.
func (p *Peer) State() (string, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.state, p.err
}

// instance is a running peer, however launched.
type instance interface {
	kill() error
	pause() error
	resume() error
	setSlowdown(f float64) error
	stop(timeout time.Duration)
	done() <-chan struct{}
	result() error
	metrics() (PeerMetrics, bool) // from outside the process, if any
}

// Launcher starts peers: Goroutines or *Processes.
type Launcher interface {
	launch(ctx context.Context, p *Peer) (instance, error)
}

// Options tunes Start.
type Options struct {
	// Network overrides the network built from the spec's profile.
	Network *netem.Network
	// StopTimeout is how long Stop waits for a peer before killing it
	// (default 5 s). It is real time: processes run on the wall clock.
	StopTimeout time.Duration
	// Clock times the failure schedule, the peers' devices and metrics,
	// the report and the network built from the spec's profile. Nil means
	// the wall clock; tests pass a clock.Fake.
	Clock clock.Clock
}

// Swarm is a running set of peers.
type Swarm struct {
	spec   *Spec
	net    *netem.Network
	peers  []*Peer
	byName map[string]*Peer
	start  time.Time
	opts   Options
	clk    clock.Clock

	cancel   context.CancelFunc
	unhook   func() bool
	schedWG  sync.WaitGroup
	allDone  chan struct{}
	stopOnce sync.Once

	launcher Launcher
	ctx      context.Context // the peers' context, cancelled by Stop
	schedEnd chan struct{}   // closed when the schedule returns

	mu       sync.Mutex
	events   []Event
	end      time.Time
	stopping bool // no more launches
}

// Start validates spec, launches every peer with l and starts the failure
// schedule. Cancelling ctx stops the swarm as Stop does. If a peer fails to
// launch, the ones already started are stopped and the error is returned.
func Start(ctx context.Context, spec *Spec, l Launcher, opts Options) (*Swarm, error) {
	if err := spec.Validate(); err != nil {
		return nil, err
	}
	if opts.StopTimeout <= 0 {
		opts.StopTimeout = 5 * time.Second
	}
	clk := clock.Or(opts.Clock)
	n := opts.Network
	if n == nil && spec.Profile != nil {
		var err error
		if n, err = netem.New(spec.Profile, spec.Seed, netem.WithClock(clk)); err != nil {
			return nil, err
		}
	}
	parent := ctx
	ctx, cancel := context.WithCancel(ctx)
	s := &Swarm{
		spec: spec, net: n, byName: map[string]*Peer{},
		opts: opts, clk: clk, cancel: cancel, allDone: make(chan struct{}),
		launcher: l, ctx: ctx, schedEnd: make(chan struct{}),
	}
	s.start = clk.Now()
	launches := spec.launches()
	for _, ps := range spec.Peers() {
		dev, err := NewDevice(ps.Class, ps.Slowdown, ps.MemoryBytes, WithClock(clk))
		if err != nil {
			s.abort()
			return nil, err
		}
		p := &Peer{
			Index: ps.Index, Name: ps.Name, Class: ps.Class, Region: ps.Region,
			Role: ps.Role, NAT: ps.NAT,
			Device: dev, Metrics: newRecorder(clk), Network: n, Clock: clk, state: StatePending,
			launched: make(chan instance, len(launches[ps.Name])),
		}
		s.peers = append(s.peers, p)
		s.byName[p.Name] = p
		if ps.Start == 0 {
			if err := s.launch(p); err != nil {
				s.abort()
				return nil, err
			}
		}
	}
	var watchers sync.WaitGroup
	for _, p := range s.peers {
		watchers.Add(1)
		go func() {
			defer watchers.Done()
			s.watch(p, len(launches[p.Name]))
		}()
	}
	go func() {
		watchers.Wait()
		s.mu.Lock()
		s.end = clk.Now()
		s.mu.Unlock()
		close(s.allDone)
	}()
	s.schedWG.Add(1)
	go s.runSchedule(ctx)
	s.unhook = context.AfterFunc(parent, s.stopPeers)
	return s, nil
}

// launch starts (or restarts) p, unless the swarm is stopping.
func (s *Swarm) launch(p *Peer) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.stopping {
		return errors.New("swarm: stopping")
	}
	if p.startsLeft() == 0 {
		return fmt.Errorf("swarm: %s has no (re)start left in the spec's schedule", p.Name)
	}
	inst, err := s.launcher.launch(s.ctx, p)
	if err != nil {
		return fmt.Errorf("swarm: launching %s: %w", p.Name, err)
	}
	p.mu.Lock()
	p.inst, p.state, p.err, p.killed, p.stopped = inst, StateRunning, nil, false, false
	p.starts++
	p.mu.Unlock()
	p.launched <- inst
	return nil
}

// abort stops the peers launched so far by a failed Start.
func (s *Swarm) abort() {
	s.cancel()
	for _, p := range s.peers {
		if inst, err := p.current(); err == nil {
			inst.stop(s.opts.StopTimeout)
		}
	}
}

// watch records how each of a peer's n starts ended. It returns early
// when the schedule ended before a planned restart.
func (s *Swarm) watch(p *Peer, n int) {
	for range n {
		var inst instance
		select {
		case inst = <-p.launched:
		case <-s.schedEnd:
			select {
			case inst = <-p.launched:
			default:
				return
			}
		}
		<-inst.done()
		err := inst.result()
		p.mu.Lock()
		switch {
		case p.killed:
			p.state = StateKilled
		case p.stopped:
			p.state = StateStopped
		case err != nil:
			p.state, p.err = StateFailed, err
		default:
			p.state = StateExited
		}
		p.mu.Unlock()
	}
}

// Peers returns the peers in index order.
func (s *Swarm) Peers() []*Peer { return s.peers }

// Peer returns the named peer.
func (s *Swarm) Peer(name string) (*Peer, bool) {
	p, ok := s.byName[name]
	return p, ok
}

// Network returns the swarm's network (nil without a profile).
func (s *Swarm) Network() *netem.Network { return s.net }

// StartTime is when the swarm started; the schedule counts from it.
func (s *Swarm) StartTime() time.Time { return s.start }

func (s *Swarm) lookup(name string) (*Peer, error) {
	p, ok := s.byName[name]
	if !ok {
		return nil, fmt.Errorf("swarm: no peer named %q", name)
	}
	return p, nil
}

// running returns the named peer and its current instance.
func (s *Swarm) running(name string) (*Peer, instance, error) {
	p, err := s.lookup(name)
	if err != nil {
		return nil, nil, err
	}
	inst, err := p.current()
	if err != nil {
		return nil, nil, err
	}
	return p, inst, nil
}

// Kill crashes the named peer: SIGKILL for a process, context cancellation
// for a goroutine; its registered identities are crashed in the network.
func (s *Swarm) Kill(name string) error {
	p, inst, err := s.running(name)
	if err != nil {
		return err
	}
	p.mu.Lock()
	p.killed = true
	p.mu.Unlock()
	s.cut(p, true)
	return inst.kill()
}

// cut crashes (down) or recovers the peer's registered identities in the
// network.
func (s *Swarm) cut(p *Peer, down bool) {
	if s.net == nil {
		return
	}
	p.mu.Lock()
	ids := append([]peer.ID(nil), p.ids...)
	p.mu.Unlock()
	for _, id := range ids {
		if down {
			s.net.Crash(id)
		} else {
			s.net.Recover(id)
		}
	}
}

// Partition cuts the named peer off from every other peer in the network
// (its process keeps running); Rejoin heals it.
func (s *Swarm) Partition(name string) error {
	p, err := s.lookup(name)
	if err != nil {
		return err
	}
	if s.net == nil {
		return errors.New("swarm: a partition needs a network")
	}
	s.cut(p, true)
	return nil
}

// Rejoin brings the named peer back: a killed (or ended) peer is started
// again with the same identity, a partitioned one is reconnected.
func (s *Swarm) Rejoin(name string) error {
	p, err := s.lookup(name)
	if err != nil {
		return err
	}
	s.cut(p, false)
	inst, err := p.current()
	if err != nil {
		return err
	}
	select {
	case <-inst.done():
		return s.launch(p)
	default:
		return nil // partitioned only
	}
}

// Pause freezes the named peer (SIGSTOP, or the device's pause gate).
func (s *Swarm) Pause(name string) error {
	_, inst, err := s.running(name)
	if err != nil {
		return err
	}
	return inst.pause()
}

// Resume undoes Pause.
func (s *Swarm) Resume(name string) error {
	_, inst, err := s.running(name)
	if err != nil {
		return err
	}
	return inst.resume()
}

// SetSlowdown changes the named peer's slowdown factor.
func (s *Swarm) SetSlowdown(name string, f float64) error {
	if err := checkSlowdown(f); err != nil {
		return err
	}
	_, inst, err := s.running(name)
	if err != nil {
		return err
	}
	return inst.setSlowdown(f)
}

func (s *Swarm) apply(f Failure) error {
	switch f.Action {
	case ActionKill:
		return s.Kill(f.Peer)
	case ActionPause:
		return s.Pause(f.Peer)
	case ActionResume:
		return s.Resume(f.Peer)
	case ActionSlowdown:
		return s.SetSlowdown(f.Peer, f.Factor)
	case ActionPartition:
		return s.Partition(f.Peer)
	case ActionRejoin:
		return s.Rejoin(f.Peer)
	}
	return fmt.Errorf("swarm: unknown action %q", f.Action)
}

// runSchedule fires the failure schedule until ctx ends or all peers exit.
func (s *Swarm) runSchedule(ctx context.Context) {
	defer s.schedWG.Done()
	defer close(s.schedEnd)
	var timer clock.Timer
	defer func() {
		if timer != nil {
			timer.Stop()
		}
	}()
	for _, f := range s.spec.scheduleWithStarts() {
		d := s.start.Add(f.At).Sub(s.clk.Now())
		if timer == nil {
			timer = s.clk.NewTimer(d)
		} else {
			timer.Reset(d)
		}
		select {
		case <-timer.C():
		case <-ctx.Done():
			return
		case <-s.allDone:
			return
		}
		var err error
		if f.Action == actionStart {
			err = s.launch(s.byName[f.Peer])
		} else {
			err = s.apply(f)
		}
		ev := Event{At: f.At, Fired: s.clk.Now().Sub(s.start), Action: f.Action, Peer: f.Peer, Factor: f.Factor}
		if err != nil {
			ev.Error = err.Error()
		}
		s.mu.Lock()
		s.events = append(s.events, ev)
		s.mu.Unlock()
	}
}

// Done is closed when every peer has ended.
func (s *Swarm) Done() <-chan struct{} { return s.allDone }

// Wait blocks until every peer has ended (or ctx ends) and returns the
// errors of the peers that failed; killed and stopped peers are not errors.
func (s *Swarm) Wait(ctx context.Context) error {
	select {
	case <-s.allDone:
	case <-ctx.Done():
		return ctx.Err()
	}
	s.schedWG.Wait()
	return s.failures()
}

func (s *Swarm) failures() error {
	var errs []error
	for _, p := range s.peers {
		if st, err := p.State(); st == StateFailed {
			errs = append(errs, fmt.Errorf("%s: %w", p.Name, err))
		}
	}
	return errors.Join(errs...)
}

// Stop stops every peer still running—cancelling goroutine peers, sending
// SIGTERM to processes and SIGKILL after the stop timeout—and waits for
// them and for the schedule. It returns the errors of failed peers.
func (s *Swarm) Stop() error {
	s.unhook()
	s.stopPeers()
	<-s.allDone
	s.schedWG.Wait()
	return s.failures()
}

// stopPeers stops the running peers once.
func (s *Swarm) stopPeers() {
	s.stopOnce.Do(func() {
		s.mu.Lock()
		s.stopping = true
		s.mu.Unlock()
		var running []*Peer
		for _, p := range s.peers {
			inst, err := p.current()
			if err != nil {
				continue
			}
			select {
			case <-inst.done():
				continue
			default:
			}
			p.mu.Lock()
			p.stopped = true
			p.mu.Unlock()
			running = append(running, p)
		}
		s.cancel()
		var wg sync.WaitGroup
		for _, p := range running {
			wg.Add(1)
			go func() {
				defer wg.Done()
				inst, _ := p.current()
				inst.stop(s.opts.StopTimeout)
			}()
		}
		wg.Wait()
	})
}

// Report aggregates the peers' states and metrics and the schedule's
// events. It may be called while the swarm runs.
func (s *Swarm) Report() Report {
	s.mu.Lock()
	r := Report{Start: s.start, End: s.end, Events: append([]Event(nil), s.events...), Totals: map[string]float64{}}
	s.mu.Unlock()
	if r.End.IsZero() {
		r.End = s.clk.Now()
	}
	for _, p := range s.peers {
		st, err := p.State()
		var m PeerMetrics
		ok := false
		if inst, ierr := p.current(); ierr == nil {
			m, ok = inst.metrics()
		}
		if !ok {
			m = p.Metrics.Snapshot()
		}
		pr := PeerReport{Index: p.Index, Name: p.Name, Class: p.Class, Region: p.Region, State: st, Metrics: m}
		if err != nil {
			pr.Error = err.Error()
		}
		for k, v := range m.Counters {
			r.Totals[k] += v
		}
		r.Peers = append(r.Peers, pr)
	}
	return r
}
