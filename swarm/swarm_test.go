package swarm

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/skyhive/skyhive/clock"
	"github.com/skyhive/skyhive/clock/clocktest"
	"github.com/skyhive/skyhive/netem"
	"go.uber.org/goleak"
)

const childEnv = "SKYHIVE_SWARM_TEST_CHILD"

func TestMain(m *testing.M) {
	if os.Getenv(childEnv) == "1" {
		os.Exit(childMain())
	}
	goleak.VerifyTestMain(m)
}

// childMain is the peer body of the process tests: it ticks every 10 ms
// (throttled by its device), flushes metrics and exits 0 on SIGTERM.
func childMain() int {
	c, err := ChildFromEnv()
	if err != nil || c == nil {
		return 2
	}
	ctx, stop := signalContext()
	defer stop()
	env, _ := strconv.ParseFloat(os.Getenv(EnvSlowdown), 64)
	c.Metrics.Set("slowdown_env", env)
	for i := 0; i < 3000; i++ { // bounded: 30 s at most
		if err := c.Device.Throttle(ctx, 10*time.Millisecond); err != nil {
			break
		}
		c.Metrics.Add("ticks", 1)
		c.Metrics.Observe("tick", float64(i))
		c.Metrics.Set("slowdown", c.Device.Slowdown())
		if err := c.Flush(); err != nil {
			return 3
		}
		select {
		case <-ctx.Done():
		case <-time.After(10 * time.Millisecond):
			continue
		}
		break
	}
	c.Metrics.Add("clean_exits", 1)
	if err := c.Flush(); err != nil {
		return 3
	}
	return 0
}

func TestLoadExampleSpec(t *testing.T) {
	s, err := LoadSpec("../examples/swarm.json")
	if err != nil {
		t.Fatal(err)
	}
	peers := s.Peers()
	if len(peers) != 8 {
		t.Fatalf("%d peers, want 8", len(peers))
	}
	if p := peers[1]; p.Name != "fast-1" || p.Region != "eu-west" || p.MemoryBytes != 8<<30 {
		t.Errorf("peer 1 = %+v", p)
	}
	if p := peers[6]; p.Name != "slow-2" || p.Region != "ap-south" || p.Slowdown != 3 {
		t.Errorf("peer 6 = %+v", p)
	}
	sched := s.schedule()
	if len(sched) != 4 || sched[2].Action != ActionResume || sched[2].At != 40*time.Second {
		t.Errorf("schedule = %+v", sched)
	}
}

func TestParseSpecErrors(t *testing.T) {
	cases := map[string]struct{ json, want string }{
		"empty":          {`{}`, `"devices" is empty`},
		"count":          {`{"devices":[{"name":"a","count":0}]}`, `count 0 must be at least 1`},
		"slowdown":       {`{"devices":[{"name":"a","count":1,"slowdown":0.5}]}`, `slowdown 0.5`},
		"dup class":      {`{"devices":[{"name":"a","count":1},{"name":"a","count":1}]}`, `listed twice`},
		"unknown region": {`{"network":"../examples/regions.json","devices":[{"name":"a","count":1,"regions":["mars"]}]}`, `region "mars" is not in the network profile`},
		"missing file":   {`{"network":"nope.json","devices":[{"name":"a","count":1}]}`, `nope.json`},
		"bad peer":       {`{"devices":[{"name":"a","count":1}],"failures":[{"at":"1s","action":"kill","peer":"a-5"}]}`, `no peer named "a-5"`},
		"bad action":     {`{"devices":[{"name":"a","count":1}],"failures":[{"at":"1s","action":"explode","peer":"a-0"}]}`, `unknown action "explode"`},
		"bad time":       {`{"devices":[{"name":"a","count":1}],"failures":[{"at":"10","action":"kill","peer":"a-0"}]}`, `"at"`},
		"factor":         {`{"devices":[{"name":"a","count":1}],"failures":[{"at":"1s","action":"slowdown","peer":"a-0"}]}`, `factor 0 must be >= 1`},
		"for on kill":    {`{"devices":[{"name":"a","count":1}],"failures":[{"at":"1s","action":"kill","peer":"a-0","for":"2s"}]}`, `"for" only applies to pause`},
		"typo":           {`{"devices":[{"name":"a","count":1,"slowdwn":2}]}`, `unknown field "slowdwn"`},
		"role":           {`{"devices":[{"name":"a","count":1,"role":"miner"}]}`, `unknown role "miner"`},
		"runner field":   {`{"devices":[{"name":"d","count":1,"role":"dht","config":{"listen":["/ip4/1.2.3.4/tcp/1"]}}]}`, `"listen" is set by swarm run`},
		"unknown field":  {`{"devices":[{"name":"d","count":1,"role":"dht","config":{"algo":"wagma"}}]}`, `unknown field "algo"`},
		"config no role": {`{"devices":[{"name":"d","count":1,"config":{}}]}`, `needs a known "role"`},
		"mixed roles":    {`{"devices":[{"name":"d","count":1,"role":"dht"},{"name":"a","count":1}]}`, `either every device class has a "role"`},
		"no dht":         {`{"devices":[{"name":"p","count":2,"role":"peer"}]}`, `join through a DHT`},
		"no coordinator": {`{"devices":[{"name":"w","count":2,"role":"worker"}]}`, `workers need a device class with "role": "coordinator"`},
		"stranger open":  {`{"devices":[{"name":"d","count":1,"role":"dht"},{"name":"p","count":1,"role":"peer","stranger":true}]}`, `"stranger" needs "closed": true`},
		"secret field":   {`{"closed":true,"devices":[{"name":"d","count":1,"role":"dht","config":{"swarm_secret":"x"}}]}`, `"swarm_secret" is set by swarm run`},
		"nat no relay":   {`{"devices":[{"name":"d","count":1,"role":"dht"},{"name":"p","count":1,"role":"peer","nat":true}]}`, `join through a relay`},
		"isolation":      {`{"isolation":"vm","devices":[{"name":"a","count":1}]}`, `isolation "vm"`},
		"bad start":      {`{"devices":[{"name":"a","count":1,"start":"soon"}]}`, `"start"`},
		"before start":   {`{"devices":[{"name":"a","count":1,"start":"10s"}],"failures":[{"at":"5s","action":"kill","peer":"a-0"}]}`, `starts only at 10s`},
		"rejoin":         {`{"devices":[{"name":"a","count":1}],"failures":[{"at":"5s","action":"rejoin","peer":"a-0"}]}`, `neither killed nor partitioned`},
		"partition":      {`{"devices":[{"name":"a","count":1}],"failures":[{"at":"5s","action":"partition","peer":"a-0"}]}`, `needs a "network"`},
	}
	for name, c := range cases {
		_, err := ParseSpec([]byte(c.json), ".")
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: err = %v, want it to contain %q", name, err, c.want)
		}
	}
}

var epoch = clocktest.Epoch

func ctxT(t testing.TB) context.Context { return clocktest.Context(t, 20*time.Second) }

var async = clocktest.Go

// eventually waits until cond holds, polling every 5 ms. It asserts no
// timing; the bound only turns a hang into a failure.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not after 20 s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func TestDevicePauseGateAndThrottle(t *testing.T) {
	clk := clock.NewFake(epoch)
	d, err := NewDevice("x", 3, 0, WithClock(clk))
	if err != nil {
		t.Fatal(err)
	}
	ctx := ctxT(t)
	// Throttle(20ms) at slowdown 3 sleeps 40 ms on the device's clock.
	done := async(func() error { return d.Throttle(ctx, 20*time.Millisecond) })
	if err := clk.BlockUntil(ctx, 1); err != nil {
		t.Fatal(err)
	}
	clk.Advance(40*time.Millisecond - time.Nanosecond)
	if clk.Waiters() != 1 {
		t.Fatal("Throttle(20ms) at slowdown 3 stopped sleeping before 40 ms")
	}
	clk.Advance(time.Nanosecond)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	// At slowdown 1 Throttle does not sleep at all.
	if err := d.SetSlowdown(1); err != nil {
		t.Fatal(err)
	}
	if err := d.Throttle(ctx, time.Hour); err != nil || clk.Waiters() != 0 {
		t.Fatalf("Throttle at slowdown 1: %v, %d timers", err, clk.Waiters())
	}
	d.SetSlowdown(3)

	d.Pause()
	released := make(chan struct{})
	go func() {
		d.Checkpoint(ctx)
		close(released)
	}()
	throttled := async(func() error { return d.Throttle(ctx, time.Millisecond) })
	// No amount of time passes a closed gate. (The real sleep only gives
	// a broken gate the chance to show; it cannot fail a working one.)
	clk.Advance(time.Hour)
	time.Sleep(20 * time.Millisecond)
	select {
	case <-released:
		t.Fatal("Checkpoint passed a closed gate")
	case err := <-throttled:
		t.Fatalf("Throttle passed a closed gate: %v", err)
	default:
	}
	if clk.Waiters() != 0 {
		t.Fatal("a paused Throttle is sleeping instead of waiting at the gate")
	}
	d.Resume()
	<-released
	// Past the gate, the throttle sleeps its 2 ms.
	if err := clk.BlockUntil(ctx, 1); err != nil {
		t.Fatal(err)
	}
	clk.Advance(2 * time.Millisecond)
	if err := <-throttled; err != nil {
		t.Fatal(err)
	}
	d.Pause()
	cctx, cancel := context.WithCancel(ctx)
	throttled = async(func() error { return d.Throttle(cctx, time.Millisecond) })
	cancel()
	if err := <-throttled; !errors.Is(err, context.Canceled) {
		t.Errorf("paused Throttle with a cancelled context: %v", err)
	}
	d.Resume()
	if err := d.SetSlowdown(0.5); err == nil {
		t.Error("slowdown 0.5 accepted")
	}
}

func goroutineSpec() *Spec {
	return &Spec{Devices: []DeviceClass{
		{Name: "fast", Count: 10, Slowdown: 1},
		{Name: "slow", Count: 10, Slowdown: 3},
	}}
}

// stepper is a peer that "computes" for 2 ms per step on the swarm's clock.
func stepper(ctx context.Context, p *Peer) error {
	for i := 0; i < 100000; i++ {
		if err := p.Clock.Sleep(ctx, 2*time.Millisecond); err != nil {
			return err
		}
		if err := p.Device.Throttle(ctx, 2*time.Millisecond); err != nil {
			return err
		}
		p.Metrics.Add("steps", 1)
		p.Metrics.Observe("step", float64(i))
	}
	return nil
}

func TestGoroutineSwarm(t *testing.T) {
	clk := clock.NewFake(epoch)
	ctx := ctxT(t)
	spec := goroutineSpec()
	s, err := Start(context.Background(), spec, Goroutines(stepper), Options{Clock: clk})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Stop()
	// Run 400 ms, one millisecond at a time: each peer always has exactly
	// one timer armed (its step or its throttle) when it is waiting.
	peers := 0
	for _, c := range spec.Devices {
		peers += c.Count
	}
	for range 400 {
		if err := clk.BlockUntil(ctx, peers); err != nil {
			t.Fatal(err)
		}
		clk.Advance(time.Millisecond)
	}
	if err := clk.BlockUntil(ctx, peers); err != nil { // the last steps are counted
		t.Fatal(err)
	}
	if err := s.Stop(); err != nil {
		t.Fatal(err)
	}
	r := s.Report()
	if len(r.Peers) != 20 {
		t.Fatalf("%d peers in report", len(r.Peers))
	}
	if !r.Start.Equal(epoch) || !r.End.Equal(epoch.Add(400*time.Millisecond)) {
		t.Errorf("report from %v to %v, want the fake clock's 400 ms", r.Start, r.End)
	}
	// Fast steps take 2 ms, slow ones 2 + 4 ms: in 400 ms exactly 200 and
	// 66 steps, the last ones done at 400 and 396 ms.
	var fast, slow float64
	for _, p := range r.Peers {
		if p.State != StateStopped {
			t.Errorf("%s: state %s", p.Name, p.State)
		}
		steps, last := 200.0, 400*time.Millisecond
		if p.Class == "fast" {
			fast += p.Metrics.Counters["steps"]
		} else {
			steps, last = 66, 396*time.Millisecond
			slow += p.Metrics.Counters["steps"]
		}
		smp := p.Metrics.Samples["step"]
		if p.Metrics.Counters["steps"] != steps || len(smp) != int(steps) || !smp[len(smp)-1].Time.Equal(epoch.Add(last)) {
			t.Errorf("%s: %v steps and %d samples, want %v, the last at %v",
				p.Name, p.Metrics.Counters["steps"], len(smp), steps, last)
			continue
		}
	}
	if r.Totals["steps"] != fast+slow || fast != 2000 || slow != 660 {
		t.Fatalf("totals %v, fast %v, slow %v", r.Totals, fast, slow)
	}
	path := filepath.Join(t.TempDir(), "report.json")
	if err := r.WriteFile(path); err != nil {
		t.Fatal(err)
	}
}

func TestFailureSchedule(t *testing.T) {
	clk := clock.NewFake(epoch)
	ctx := ctxT(t)
	spec := goroutineSpec()
	spec.Failures = []Failure{
		{At: 100 * time.Millisecond, Action: ActionSlowdown, Peer: "fast-0", Factor: 5},
		{At: 150 * time.Millisecond, Action: ActionPause, Peer: "slow-0", For: 200 * time.Millisecond},
		{At: 250 * time.Millisecond, Action: ActionKill, Peer: "fast-1"},
	}
	// The peers only wait to be stopped, so the schedule's timer is the
	// only one on the clock.
	run := func(ctx context.Context, p *Peer) error {
		<-ctx.Done()
		return ctx.Err()
	}
	s, err := Start(context.Background(), spec, Goroutines(run), Options{Clock: clk})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Stop()
	f0, _ := s.Peer("fast-0")
	f1, _ := s.Peer("fast-1")
	s0, _ := s.Peer("slow-0")
	events := func() int { return len(s.Report().Events) }
	// fireAt advances to the n-th event's time, checking that it has not
	// fired a nanosecond before, and waits until it has been applied.
	fireAt := func(at time.Duration, n int) {
		t.Helper()
		if err := clk.BlockUntil(ctx, 1); err != nil {
			t.Fatal(err)
		}
		clk.Advance(at - time.Nanosecond - clk.Now().Sub(epoch))
		if clk.Waiters() != 1 || events() != n-1 {
			t.Fatalf("event %d fired before %v", n, at)
		}
		clk.Advance(time.Nanosecond)
		eventually(t, "event applied", func() bool { return events() == n })
	}
	if f0.Device.Slowdown() != 1 {
		t.Fatalf("fast-0 starts at slowdown %v", f0.Device.Slowdown())
	}
	fireAt(100*time.Millisecond, 1)
	if f0.Device.Slowdown() != 5 {
		t.Errorf("fast-0 slowdown %v after the slowdown event", f0.Device.Slowdown())
	}
	if s0.Device.Paused() {
		t.Error("slow-0 paused before 150 ms")
	}
	fireAt(150*time.Millisecond, 2)
	if !s0.Device.Paused() {
		t.Error("slow-0 not paused at 150 ms")
	}
	if st, _ := f1.State(); st != StateRunning {
		t.Errorf("fast-1 %s before 250 ms", st)
	}
	fireAt(250*time.Millisecond, 3)
	select {
	case <-f1.inst.done():
	case <-ctx.Done():
		t.Fatal("fast-1 was not killed")
	}
	if !s0.Device.Paused() {
		t.Error("slow-0 resumed before 350 ms")
	}
	fireAt(350*time.Millisecond, 4)
	if s0.Device.Paused() {
		t.Error("slow-0 still paused after its 200 ms")
	}
	if clk.Waiters() != 0 {
		t.Errorf("%d timers armed after the last event", clk.Waiters())
	}
	if err := s.Stop(); err != nil {
		t.Fatal(err)
	}
	r := s.Report()
	if len(r.Events) != 4 {
		t.Fatalf("events %+v", r.Events)
	}
	for _, e := range r.Events {
		if e.Fired != e.At || e.Error != "" {
			t.Errorf("event %+v fired at %v", e, e.Fired)
		}
	}
	if st, _ := f1.State(); st != StateKilled {
		t.Errorf("fast-1 state %s", st)
	}
	if st, _ := f0.State(); st != StateStopped {
		t.Errorf("fast-0 state %s", st)
	}
}

// TestProcessSwarm runs real child processes, which live on the wall
// clock and are paused with real signals, so it cannot use a fake clock.
// Instead of fixed sleeps it waits for what it checks, and it judges the
// pause window by when the schedule actually fired, so a loaded machine
// only makes it slower.
func TestProcessSwarm(t *testing.T) {
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	spec := &Spec{
		Devices: []DeviceClass{{Name: "w", Count: 3, Slowdown: 2, MemoryMB: 256}},
		Failures: []Failure{
			{At: 300 * time.Millisecond, Action: ActionKill, Peer: "w-1"},
			{At: 200 * time.Millisecond, Action: ActionPause, Peer: "w-2", For: 400 * time.Millisecond},
			{At: 100 * time.Millisecond, Action: ActionSlowdown, Peer: "w-0", Factor: 3},
		},
	}
	launcher := &Processes{
		Path: exe,
		Env:  func(p *Peer) []string { return []string{childEnv + "=1"} },
		Dir:  dir,
	}
	s, err := Start(context.Background(), spec, launcher, Options{StopTimeout: 3 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Stop()
	byName := func(r Report) map[string]PeerMetrics {
		m := map[string]PeerMetrics{}
		for _, p := range r.Peers {
			m[p.Name] = p.Metrics
		}
		return m
	}
	eventually(t, "all four events fired", func() bool { return len(s.Report().Events) == 4 })
	var pause, resume Event
	for _, e := range s.Report().Events {
		switch e.Action {
		case ActionPause:
			pause = e
		case ActionResume:
			resume = e
		}
	}
	eventually(t, "w-0 sees its new slowdown and w-2 ticks again after the resume", func() bool {
		m := byName(s.Report())
		after := false
		for _, smp := range m["w-2"].Samples["tick"] {
			after = after || smp.Time.Sub(s.StartTime()) > resume.Fired
		}
		return after && m["w-0"].Gauges["slowdown"] == 3
	})
	if err := s.Stop(); err != nil {
		t.Fatalf("Stop: %v (logs in %s)", err, dir)
	}
	r := s.Report()
	states := map[string]string{}
	for _, p := range r.Peers {
		states[p.Name] = p.State
		if p.Name == "w-1" && len(p.Metrics.Counters) == 0 {
			// Killed at 300 ms: on a loaded machine the child may not have
			// started ticking by then. Its state is checked below.
			continue
		}
		if p.Metrics.Counters["ticks"] == 0 {
			t.Errorf("%s reported no ticks", p.Name)
		}
		if p.Metrics.Gauges["slowdown_env"] != 2 {
			t.Errorf("%s started with slowdown %v", p.Name, p.Metrics.Gauges["slowdown_env"])
		}
	}
	want := map[string]string{"w-0": StateStopped, "w-1": StateKilled, "w-2": StateStopped}
	for k, v := range want {
		if states[k] != v {
			t.Errorf("%s state %s, want %s", k, states[k], v)
		}
	}
	m := byName(r)
	if m["w-1"].Counters["clean_exits"] != 0 || m["w-0"].Counters["clean_exits"] != 1 {
		t.Errorf("clean exits: killed %v, stopped %v", m["w-1"].Counters["clean_exits"], m["w-0"].Counters["clean_exits"])
	}
	if m["w-0"].Gauges["slowdown"] != 3 {
		t.Errorf("w-0 did not see the slowdown change: %v", m["w-0"].Gauges["slowdown"])
	}
	// w-2 was SIGSTOPped before the pause event's Fired time and gets
	// SIGCONT no earlier than 600 ms (a timer never fires early): it takes
	// no sample in between (10 ms of slack for the signal to land).
	inside := 0
	for _, smp := range m["w-2"].Samples["tick"] {
		off := smp.Time.Sub(r.Start)
		if off > pause.Fired+10*time.Millisecond && off < 600*time.Millisecond {
			inside++
		}
	}
	if inside > 0 {
		t.Errorf("w-2 ticked %d times while stopped (pause fired at %v)", inside, pause.Fired)
	}
	if _, err := os.Stat(filepath.Join(dir, "w-1.log")); err != nil {
		t.Error(err)
	}
	if len(r.Events) != 4 {
		t.Errorf("events %+v", r.Events)
	}
	for _, e := range r.Events {
		if e.Fired < e.At || e.Error != "" {
			t.Errorf("event %+v fired early or failed", e)
		}
	}
}

func TestKillCrashesRegisteredIdentity(t *testing.T) {
	spec := &Spec{
		Profile: netem.Uniform(netem.LinkParams{Latency: time.Millisecond}),
		Devices: []DeviceClass{{Name: "p", Count: 2}},
	}
	registered := make(chan struct{}, 2)
	run := func(ctx context.Context, p *Peer) error {
		if err := p.Register(peer.ID(p.Name)); err != nil {
			return err
		}
		registered <- struct{}{}
		<-ctx.Done()
		return ctx.Err()
	}
	s, err := Start(context.Background(), spec, Goroutines(run), Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Stop()
	<-registered
	<-registered
	n := s.Network()
	if err := n.Deliver(context.Background(), "p-0", "p-1", 100); err != nil {
		t.Fatalf("before kill: %v", err)
	}
	if err := s.Kill("p-1"); err != nil {
		t.Fatal(err)
	}
	if err := n.Deliver(context.Background(), "p-0", "p-1", 100); !errors.Is(err, netem.ErrUnreachable) {
		t.Fatalf("after kill: %v", err)
	}
	if err := s.Stop(); err != nil {
		t.Fatal(err)
	}
}

// TestLateStartRejoinAndPartition drives a late start, a kill followed by
// a rejoin (a second start) and a partition healed after "for" on a fake
// clock, and checks the peers' states and the network.
func TestLateStartRejoinAndPartition(t *testing.T) {
	clk := clock.NewFake(epoch)
	spec := &Spec{
		Profile: netem.Uniform(netem.LinkParams{Latency: time.Millisecond}),
		Devices: []DeviceClass{{Name: "a", Count: 1}, {Name: "late", Count: 1, Start: 100 * time.Millisecond}},
		Failures: []Failure{
			{At: 50 * time.Millisecond, Action: ActionKill, Peer: "a-0"},
			{At: 150 * time.Millisecond, Action: ActionRejoin, Peer: "a-0"},
			{At: 200 * time.Millisecond, Action: ActionPartition, Peer: "late-0", For: 100 * time.Millisecond},
		},
	}
	if err := spec.Validate(); err != nil {
		t.Fatal(err)
	}
	run := func(ctx context.Context, p *Peer) error {
		if err := p.Register(peer.ID(p.Name)); err != nil {
			return err
		}
		<-ctx.Done()
		return ctx.Err()
	}
	s, err := Start(context.Background(), spec, Goroutines(run), Options{Clock: clk})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Stop()
	a, _ := s.Peer("a-0")
	late, _ := s.Peer("late-0")
	events := func() int { return len(s.Report().Events) }
	step := func(to time.Duration, n int) {
		t.Helper()
		clk.Advance(to - clk.Now().Sub(epoch))
		eventually(t, fmt.Sprintf("%d events at %v", n, to), func() bool { return events() == n })
	}
	if st, _ := late.State(); st != StatePending {
		t.Fatalf("late-0 is %s before its start", st)
	}
	if err := s.Kill("late-0"); err == nil {
		t.Error("killing a peer that has not started succeeded")
	}
	step(50*time.Millisecond, 1)
	eventually(t, "a-0 killed", func() bool { st, _ := a.State(); return st == StateKilled })
	step(100*time.Millisecond, 2)
	eventually(t, "late-0 started", func() bool { st, _ := late.State(); return st == StateRunning })
	step(150*time.Millisecond, 3)
	eventually(t, "a-0 restarted", func() bool { st, _ := a.State(); return st == StateRunning && a.Starts() == 2 })
	n := s.Network()
	eventually(t, "a-0 reachable again", func() bool { return n.Reachable("late-0", "a-0") })
	step(200*time.Millisecond, 4)
	if n.Reachable("a-0", "late-0") {
		t.Error("late-0 reachable while partitioned")
	}
	if st, _ := late.State(); st != StateRunning {
		t.Errorf("a partition stopped late-0: %s", st)
	}
	step(300*time.Millisecond, 5)
	if !n.Reachable("a-0", "late-0") {
		t.Error("late-0 unreachable after the partition healed")
	}
	if err := s.Stop(); err != nil {
		t.Fatal(err)
	}
	for _, e := range s.Report().Events {
		if e.Error != "" {
			t.Errorf("event %s %s: %s", e.Action, e.Peer, e.Error)
		}
	}
}
