package swarm

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"
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
	}
	for name, c := range cases {
		_, err := ParseSpec([]byte(c.json), ".")
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: err = %v, want it to contain %q", name, err, c.want)
		}
	}
}

func TestDevicePauseGateAndThrottle(t *testing.T) {
	d, err := NewDevice("x", 3, 0)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	t0 := time.Now()
	if err := d.Throttle(ctx, 20*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	if el := time.Since(t0); el < 40*time.Millisecond || el > 200*time.Millisecond {
		t.Errorf("Throttle(20ms) at slowdown 3 slept %v, want 40ms", el)
	}
	d.Pause()
	released := make(chan time.Time, 1)
	go func() {
		d.Checkpoint(ctx)
		released <- time.Now()
	}()
	time.Sleep(50 * time.Millisecond)
	select {
	case <-released:
		t.Fatal("Checkpoint passed a closed gate")
	default:
	}
	resumed := time.Now()
	d.Resume()
	if r := <-released; r.Before(resumed) {
		t.Error("released before Resume")
	}
	d.Pause()
	cctx, cancel := context.WithTimeout(ctx, 20*time.Millisecond)
	defer cancel()
	if err := d.Throttle(cctx, time.Millisecond); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("paused Throttle with deadline: %v", err)
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

// stepper is a peer that "computes" for 2 ms per step.
func stepper(ctx context.Context, p *Peer) error {
	for i := 0; i < 100000; i++ {
		t := time.NewTimer(2 * time.Millisecond)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
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
	s, err := Start(context.Background(), goroutineSpec(), Goroutines(stepper), Options{})
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(400 * time.Millisecond)
	if err := s.Stop(); err != nil {
		t.Fatal(err)
	}
	r := s.Report()
	if len(r.Peers) != 20 {
		t.Fatalf("%d peers in report", len(r.Peers))
	}
	var fast, slow float64
	for _, p := range r.Peers {
		if p.State != StateStopped {
			t.Errorf("%s: state %s", p.Name, p.State)
		}
		if p.Class == "fast" {
			fast += p.Metrics.Counters["steps"]
		} else {
			slow += p.Metrics.Counters["steps"]
		}
	}
	if r.Totals["steps"] != fast+slow || fast == 0 || slow == 0 {
		t.Fatalf("totals %v, fast %v, slow %v", r.Totals, fast, slow)
	}
	// Fast steps take 2 ms, slow ones 2 + 4 ms.
	if ratio := fast / slow; ratio < 1.8 || ratio > 4 {
		t.Errorf("fast/slow step ratio %.2f, want about 3", ratio)
	}
	path := filepath.Join(t.TempDir(), "report.json")
	if err := r.WriteFile(path); err != nil {
		t.Fatal(err)
	}
}

func TestFailureSchedule(t *testing.T) {
	spec := goroutineSpec()
	spec.Failures = []Failure{
		{At: 100 * time.Millisecond, Action: ActionSlowdown, Peer: "fast-0", Factor: 5},
		{At: 150 * time.Millisecond, Action: ActionPause, Peer: "slow-0", For: 200 * time.Millisecond},
		{At: 250 * time.Millisecond, Action: ActionKill, Peer: "fast-1"},
	}
	var pausedSeen atomic.Bool
	run := func(ctx context.Context, p *Peer) error {
		if p.Name == "slow-0" {
			// Check the gate is closed between 150 and 350 ms.
			t := time.NewTimer(250 * time.Millisecond)
			select {
			case <-t.C:
				pausedSeen.Store(p.Device.Paused())
			case <-ctx.Done():
				t.Stop()
			}
		}
		return stepper(ctx, p)
	}
	s, err := Start(context.Background(), spec, Goroutines(run), Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Stop()
	fast1, _ := s.Peer("fast-1")
	select {
	case <-time.After(2 * time.Second):
		t.Fatal("fast-1 was not killed")
	case <-fast1.inst.done():
	}
	time.Sleep(150 * time.Millisecond) // past the resume at 350 ms
	if err := s.Stop(); err != nil {
		t.Fatal(err)
	}
	r := s.Report()
	if len(r.Events) != 4 {
		t.Fatalf("events %+v", r.Events)
	}
	for _, e := range r.Events {
		if late := e.Fired - e.At; late < 0 || late > 100*time.Millisecond || e.Error != "" {
			t.Errorf("event %+v fired %v late", e, late)
		}
	}
	if st, _ := fast1.State(); st != StateKilled {
		t.Errorf("fast-1 state %s", st)
	}
	f0, _ := s.Peer("fast-0")
	if f0.Device.Slowdown() != 5 {
		t.Errorf("fast-0 slowdown %v", f0.Device.Slowdown())
	}
	s0, _ := s.Peer("slow-0")
	if !pausedSeen.Load() || s0.Device.Paused() {
		t.Errorf("slow-0: paused mid-window %v, paused at end %v", pausedSeen.Load(), s0.Device.Paused())
	}
}

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
	time.Sleep(900 * time.Millisecond)
	if err := s.Stop(); err != nil {
		t.Fatalf("Stop: %v (logs in %s)", err, dir)
	}
	r := s.Report()
	states := map[string]string{}
	for _, p := range r.Peers {
		states[p.Name] = p.State
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
	m := map[string]PeerMetrics{}
	for _, p := range r.Peers {
		m[p.Name] = p.Metrics
	}
	if m["w-1"].Counters["clean_exits"] != 0 || m["w-0"].Counters["clean_exits"] != 1 {
		t.Errorf("clean exits: killed %v, stopped %v", m["w-1"].Counters["clean_exits"], m["w-0"].Counters["clean_exits"])
	}
	if m["w-0"].Gauges["slowdown"] != 3 {
		t.Errorf("w-0 did not see the slowdown change: %v", m["w-0"].Gauges["slowdown"])
	}
	// w-2 was SIGSTOPped from 200 to 600 ms: no ticks well inside that
	// window, and ticks after it.
	var inside, after int
	for _, smp := range m["w-2"].Samples["tick"] {
		off := smp.Time.Sub(r.Start)
		if off > 250*time.Millisecond && off < 550*time.Millisecond {
			inside++
		}
		if off > 600*time.Millisecond {
			after++
		}
	}
	if inside > 0 || after == 0 {
		t.Errorf("w-2 ticked %d times while stopped and %d times after", inside, after)
	}
	if _, err := os.Stat(filepath.Join(dir, "w-1.log")); err != nil {
		t.Error(err)
	}
	if len(r.Events) != 4 {
		t.Errorf("events %+v", r.Events)
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
