package metrics

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/crypto"
	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/skyhive/skyhive/clock"
	"github.com/skyhive/skyhive/clock/clocktest"
	"github.com/skyhive/skyhive/dht"
	"github.com/skyhive/skyhive/p2p/memnet"
)

// newID returns a fresh peer ID that embeds its ed25519 key.
func newID(t testing.TB) string {
	t.Helper()
	priv, _, err := crypto.GenerateEd25519Key(nil)
	if err != nil {
		t.Fatal(err)
	}
	id, err := peer.IDFromPrivateKey(priv)
	if err != nil {
		t.Fatal(err)
	}
	return id.String()
}

// sample returns a valid record of a peer made at now.
func sample(id string, now time.Time) Status {
	return Status{
		Peer: id, Role: RolePeer, Version: "v1.2.3", Region: "eu-west",
		Addrs: []string{"/ip4/203.0.113.5/tcp/4001/p2p/" + id}, Reach: "public",
		Started: now.Add(-time.Hour), Time: now, PeriodSeconds: 15,
		Step: 1200, Samples: 38400, SamplesPerSecond: 512.5, Loss: Float(0.42), Accuracy: Float(0.87),
		Links:     []Link{{Peer: "12D3KooWfake", RTTMs: 12.5}},
		Averaging: &AveragingStatus{Run: "skyhive", Algo: "wagma", Round: 40, Groups: 38, GroupMembers: 114, SwarmPeers: 4},
	}
}

func TestStatusRoundTrip(t *testing.T) {
	now := clocktest.Epoch
	id := newID(t)
	s := sample(id, now)
	b, err := Encode(s)
	if err != nil {
		t.Fatal(err)
	}
	got, err := Decode(id, b, now)
	if err != nil {
		t.Fatal(err)
	}
	// Compare through JSON: times lose their monotonic part.
	want, _ := json.Marshal(s)
	have, _ := json.Marshal(got)
	if string(want) != string(have) {
		t.Fatalf("round trip:\n got %s\nwant %s", have, want)
	}
	if !got.Alive(now.Add(44*time.Second)) || got.Alive(now.Add(45*time.Second)) {
		t.Fatal("a record of a 15 s period should be alive for three periods")
	}
}

func TestStatusRejects(t *testing.T) {
	now := clocktest.Epoch
	id, other := newID(t), newID(t)
	cases := []struct {
		name   string
		subkey string
		mutate func(s *Status)
	}{
		{"forged: another peer's subkey", other, func(*Status) {}},
		{"subkey is not a peer ID", "alice", func(s *Status) { s.Peer = "alice" }},
		{"peer ID without its key", "QmYyQSo1c1Ym7orWxLYvCrM2EmxFTANf8wXmmE7DWjhx5N", func(s *Status) { s.Peer = "QmYyQSo1c1Ym7orWxLYvCrM2EmxFTANf8wXmmE7DWjhx5N" }},
		{"unknown role", id, func(s *Status) { s.Role = "root" }},
		{"NaN loss", id, func(s *Status) { s.Loss = new(math.NaN()) }},
		{"infinite throughput", id, func(s *Status) { s.SamplesPerSecond = math.Inf(1) }},
		{"accuracy above 1", id, func(s *Status) { s.Accuracy = Float(1.5) }},
		{"negative step", id, func(s *Status) { s.Step = -1 }},
		{"from the future", id, func(s *Status) { s.Time = now.Add(2 * MaxStatusSkew) }},
		{"started after made", id, func(s *Status) { s.Started = s.Time.Add(time.Second) }},
		{"no time", id, func(s *Status) { s.Time = time.Time{} }},
		{"zero period", id, func(s *Status) { s.PeriodSeconds = 0 }},
		{"terminal escape in region", id, func(s *Status) { s.Region = "\x1b[31mred" }},
		{"long version", id, func(s *Status) { s.Version = strings.Repeat("v", maxText+1) }},
		{"invalid UTF-8", id, func(s *Status) { s.Region = "\xff" }},
		{"too many addresses", id, func(s *Status) { s.Addrs = make([]string, MaxAddrs+1) }},
		{"too many links", id, func(s *Status) { s.Links = make([]Link, MaxLinks+1) }},
		{"negative RTT", id, func(s *Status) { s.Links[0].RTTMs = -1 }},
		{"two role parts", id, func(s *Status) { s.DHT = &DHTStatus{} }},
		{"too many experts", id, func(s *Status) {
			s.Averaging = nil
			s.Experts = &ExpertsStatus{Loads: make([]ExpertLoad, MaxExperts+1)}
		}},
		{"stage ends before it starts", id, func(s *Status) {
			s.Averaging = nil
			s.Pipeline = &PipelineStatus{Stages: []Stage{{First: 4, Last: 2}}}
		}},
	}
	for _, c := range cases {
		s := sample(id, now)
		c.mutate(&s)
		if err := s.Check(c.subkey, now); !errors.Is(err, ErrStatus) {
			t.Errorf("%s: Check = %v, want ErrStatus", c.name, err)
		}
	}
	// What JSON cannot carry is refused while decoding.
	for name, raw := range map[string]string{
		"oversized":     `{"peer":"` + id + `","role":"peer","version":"` + strings.Repeat("x", MaxStatusBytes) + `"}`,
		"NaN literal":   `{"peer":"` + id + `","role":"peer","loss":NaN}`,
		"huge number":   `{"peer":"` + id + `","role":"peer","step":1e400}`,
		"trailing data": `{"peer":"` + id + `","role":"peer"} {}`,
		"not JSON":      "\x00\x01",
	} {
		if _, err := Decode(id, []byte(raw), now); !errors.Is(err, ErrStatus) {
			t.Errorf("%s: Decode = %v, want ErrStatus", name, err)
		}
	}
	if _, err := Encode(Status{Peer: id, Role: RolePeer, Time: now, Started: now, PeriodSeconds: 1, Loss: new(math.Inf(-1))}); !errors.Is(err, ErrStatus) {
		t.Errorf("Encode of an infinite loss = %v, want ErrStatus", err)
	}
}

func TestStatusSanitize(t *testing.T) {
	now := clocktest.Epoch
	id := newID(t)
	s := sample(id, now)
	s.Loss, s.Accuracy, s.SamplesPerSecond = new(math.NaN()), Float(2), math.Inf(1)
	s.Region = "eu\x1b[0m" + strings.Repeat("é", maxText)
	s.Links = nil
	for i := range MaxLinks + 5 {
		s.Links = append(s.Links, Link{Peer: fmt.Sprint("p", i), RTTMs: float64(100 - i)})
	}
	s.Averaging = nil
	s.Experts = &ExpertsStatus{Hosted: 40}
	for i := range 40 {
		s.Experts.Loads = append(s.Experts.Loads, ExpertLoad{UID: fmt.Sprintf("ffn.0.%d", i), Calls: int64(i)})
	}
	s.Sanitize()
	if err := s.Check(id, now); err != nil {
		t.Fatalf("sanitized record: %v", err)
	}
	if s.Loss != nil || s.Accuracy != nil || s.SamplesPerSecond != 0 {
		t.Errorf("bad numbers kept: loss %v accuracy %v rate %v", s.Loss, s.Accuracy, s.SamplesPerSecond)
	}
	if !strings.HasPrefix(s.Region, "eu?[0m") {
		t.Errorf("region %q", s.Region)
	}
	if len(s.Links) != MaxLinks || s.Links[0].RTTMs != 100-float64(MaxLinks+4) {
		t.Errorf("links: %d, fastest %v; want the %d fastest", len(s.Links), s.Links[0], MaxLinks)
	}
	if len(s.Experts.Loads) != MaxExperts || s.Experts.Loads[0].Calls != 39 {
		t.Errorf("experts: %d, first %v; want the %d busiest", len(s.Experts.Loads), s.Experts.Loads[0], MaxExperts)
	}
}

func TestEncodeTrimsToBound(t *testing.T) {
	now := clocktest.Epoch
	id := newID(t)
	s := sample(id, now)
	s.Averaging = nil
	s.Links = nil
	for range MaxLinks {
		s.Links = append(s.Links, Link{Peer: newID(t), RTTMs: 1})
	}
	s.Experts = &ExpertsStatus{Hosted: MaxExperts}
	for i := range MaxExperts {
		s.Experts.Loads = append(s.Experts.Loads, ExpertLoad{UID: fmt.Sprintf("%s.%d.%d", strings.Repeat("e", 50), i, i), Calls: int64(i), Rows: 1 << 40})
	}
	b, err := Encode(s)
	if err != nil {
		t.Fatal(err)
	}
	if len(b) > MaxStatusBytes {
		t.Fatalf("%d bytes", len(b))
	}
	got, err := Decode(id, b, now)
	if err != nil {
		t.Fatal(err)
	}
	if len(got.Links) == MaxLinks || (len(got.Links) > 0 && len(got.Experts.Loads) < MaxExperts) {
		t.Fatalf("kept %d links, %d experts: want links dropped before experts", len(got.Links), len(got.Experts.Loads))
	}
	if s.Experts.Loads[0].Calls != 0 {
		t.Fatal("Encode reordered the caller's experts")
	}
}

func TestParseStatusDrops(t *testing.T) {
	now := clocktest.Epoch
	good, forger, victim := newID(t), newID(t), newID(t)
	enc := func(s Status) []byte {
		b, err := json.Marshal(s)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	later := now.Add(time.Minute)
	items := map[string]dht.Item{
		good:     {Value: enc(sample(good, now)), Expiration: later},
		victim:   {Value: enc(sample(forger, now)), Expiration: later},               // forged: claims another peer
		"bob":    {Value: enc(sample("bob", now)), Expiration: later},                // writable by anyone
		forger:   {Value: enc(sample(forger, now.Add(-time.Hour))), Expiration: now}, // expired
		newID(t): {Value: []byte(`{"peer":1}`), Expiration: later},                   // garbage
	}
	ss, dropped := ParseStatus(items, now)
	if len(ss) != 1 || ss[0].Peer != good || dropped != 4 {
		t.Fatalf("kept %v, dropped %d; want only %s, 4 dropped", ss, dropped, good)
	}
}

// recorder is a Storer that keeps what it is asked to store.
type recorder struct {
	mu     sync.Mutex
	stores []stored
	ch     chan struct{}
}

type stored struct {
	key, subkey string
	value       []byte
	exp         time.Time
}

func (r *recorder) Store(_ context.Context, key, subkey string, value []byte, exp time.Time) (int, error) {
	r.mu.Lock()
	r.stores = append(r.stores, stored{key, subkey, value, exp})
	r.mu.Unlock()
	r.ch <- struct{}{}
	return 1, nil
}

func TestPublisherPeriodAndRate(t *testing.T) {
	ctx := clocktest.Context(t, 20*time.Second)
	clk := clock.NewFake(clocktest.Epoch)
	id := newID(t)
	rec := &recorder{ch: make(chan struct{}, 4)}
	var samples int64
	live := &Live{}
	p, err := NewPublisher(PublisherConfig{
		DHT: rec, Peer: id, Role: RoleTrainer, Region: "us-east", Version: "test", Period: 10 * time.Second, Clock: clk,
		Host: func(context.Context) HostInfo {
			return HostInfo{Addrs: []string{"/ip4/127.0.0.1/tcp/1/p2p/" + id}, Reach: "local"}
		},
		Sample: func(s *Status) {
			samples += 500
			live.Update(func(l *Status) { l.Step, l.Samples, l.Loss = samples/50, samples, Float(1/float64(samples)) })
			live.Sample(s)
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	done := clocktest.Go(func() error { return p.Run(runCtx) })
	for i := range 3 {
		select {
		case <-rec.ch:
		case <-ctx.Done():
			t.Fatalf("store %d never came", i)
		}
		if i < 2 {
			if err := clk.BlockUntil(ctx, 1); err != nil {
				t.Fatal(err)
			}
			clk.Advance(10 * time.Second)
		}
	}
	stop()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if len(rec.stores) != 3 {
		t.Fatalf("%d stores, want 3", len(rec.stores))
	}
	for i, st := range rec.stores {
		at := clocktest.Epoch.Add(time.Duration(i) * 10 * time.Second)
		if st.key != StatusKey || st.subkey != id || !st.exp.Equal(at.Add(40*time.Second)) {
			t.Fatalf("store %d: key %q subkey %q expires %v; want %q, %q, %v", i, st.key, st.subkey, st.exp, StatusKey, id, at.Add(40*time.Second))
		}
		s, err := Decode(st.subkey, st.value, at)
		if err != nil {
			t.Fatalf("store %d: %v", i, err)
		}
		wantRate := 50.0 // 500 samples in 10 s
		if i == 0 {
			wantRate = 0
		}
		if !s.Time.Equal(at) || !s.Started.Equal(clocktest.Epoch) || s.Samples != int64(500*(i+1)) || s.SamplesPerSecond != wantRate ||
			s.Role != RoleTrainer || s.Region != "us-east" || s.Reach != "local" || s.Loss == nil {
			t.Fatalf("store %d: %+v (want rate %v)", i, s, wantRate)
		}
	}
	if last := p.Last(); last.Samples != 1500 {
		t.Fatalf("Last: %+v", last)
	}
}

func TestNewPublisherChecks(t *testing.T) {
	id := newID(t)
	rec := &recorder{ch: make(chan struct{}, 1)}
	for name, cfg := range map[string]PublisherConfig{
		"no DHT":       {Peer: id, Role: RolePeer},
		"not a peer":   {DHT: rec, Peer: "me", Role: RolePeer},
		"unknown role": {DHT: rec, Peer: id, Role: "boss"},
		"short period": {DHT: rec, Peer: id, Role: RolePeer, Period: time.Millisecond},
		"TTL < period": {DHT: rec, Peer: id, Role: RolePeer, Period: time.Minute, TTL: time.Second},
		"bad region":   {DHT: rec, Peer: id, Role: RolePeer, Region: "a\nb"},
	} {
		if _, err := NewPublisher(cfg); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

// TestReadStatusFromDHT publishes through a small in-memory DHT: the
// reader sees every publisher, a peer cannot store a record under another
// peer's ID, and records past their expiration are dropped.
func TestReadStatusFromDHT(t *testing.T) {
	ctx := clocktest.Context(t, 30*time.Second)
	net := memnet.NewNetwork()
	defer net.Close()
	var (
		nodes []*dht.Node
		seed  peer.AddrInfo
	)
	for i := range 4 {
		p, err := net.NewPeer()
		if err != nil {
			t.Fatal(err)
		}
		n, err := dht.New(p, dht.Config{})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { n.Close() })
		if i == 0 {
			seed = p.AddrInfo()
		} else if err := n.Bootstrap(ctx, []peer.AddrInfo{seed}); err != nil {
			t.Fatal(err)
		}
		nodes = append(nodes, n)
	}
	roles := []string{RoleDHT, RoleServer, RolePeer}
	for i, role := range roles {
		p, err := NewPublisher(PublisherConfig{DHT: nodes[i], Peer: nodes[i].ID().String(), Role: role, Period: time.Second})
		if err != nil {
			t.Fatal(err)
		}
		if err := p.Publish(ctx); err != nil {
			t.Fatal(err)
		}
	}
	// The fourth node tries to pass itself off as the first: the DHT
	// refuses to sign for another peer, and a raw store would fail the
	// replicas' signature check.
	forged := sample(nodes[0].ID().String(), time.Now())
	forged.Role = RoleCoordinator
	b, err := Encode(forged)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := nodes[3].Store(ctx, StatusKey, nodes[0].ID().String(), b, time.Now().Add(time.Minute)); !errors.Is(err, dht.ErrNotOwner) {
		t.Fatalf("forged store: %v, want ErrNotOwner", err)
	}
	ss, dropped, err := ReadStatus(ctx, nodes[3], time.Now())
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for _, s := range ss {
		got[s.Peer] = s.Role
	}
	if len(ss) != 3 || dropped != 0 || got[nodes[0].ID().String()] != RoleDHT {
		t.Fatalf("read %v (dropped %d), want the 3 honest records", got, dropped)
	}
	// Four periods later the records have expired.
	ss, dropped, err = ReadStatus(ctx, nodes[3], time.Now().Add(4*time.Second+time.Millisecond))
	if err != nil || len(ss) != 0 || dropped != 3 {
		t.Fatalf("after expiry: %d records, %d dropped, %v; want 0, 3", len(ss), dropped, err)
	}
}

// crowdedGetter answers like a DHT node whose replicas' answers were near
// their limit.
type crowdedGetter struct{ items map[string]dht.Item }

func (g crowdedGetter) Get(ctx context.Context, key string) (map[string]dht.Item, error) {
	items, _, err := g.GetStats(ctx, key)
	return items, err
}

func (g crowdedGetter) GetStats(context.Context, string) (map[string]dht.Item, dht.Stats, error) {
	return g.items, dht.Stats{Crowded: true}, nil
}

func TestStatusReportSaysTheKeyIsCrowded(t *testing.T) {
	now := time.Now()
	b, err := Encode(sample("12D3KooWQYhTNQdmr3ArTeUHRYzFg94BKyTkoWBDWez9kSCVe2Xo", now))
	if err != nil {
		t.Fatal(err)
	}
	g := crowdedGetter{items: map[string]dht.Item{"12D3KooWQYhTNQdmr3ArTeUHRYzFg94BKyTkoWBDWez9kSCVe2Xo": {Value: b, Expiration: now.Add(time.Minute)}}}
	r, err := ReadStatusReport(context.Background(), g, now)
	if err != nil || !r.Crowded {
		t.Fatalf("report %+v, %v: want it crowded", r, err)
	}
	var out strings.Builder
	r.WriteTable(&out)
	if !strings.Contains(out.String(), "warning: the status key holds more records") {
		t.Errorf("the table does not warn:\n%s", out.String())
	}
}
