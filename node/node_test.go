package node

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/core/protocol"
	"go.uber.org/goleak"

	"github.com/skyhive/skyhive/metrics"
	"github.com/skyhive/skyhive/p2p"
)

// libp2pGlobal is go-log's process-wide writer, started once by libp2p.
var libp2pGlobal = goleak.IgnoreAnyFunction("github.com/ipfs/go-log/v2/writer.(*MirrorWriter).logRoutine")

func TestMain(m *testing.M) { goleak.VerifyTestMain(m, libp2pGlobal) }

var loopback = NetConfig{Listen: []string{"/ip4/127.0.0.1/tcp/0"}}

// syncBuffer is a log safe for concurrent writers.
type syncBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// TestTwoNodes: a second node joins the DHT through the first; a record
// stored by one is read by the other; the first's status record, with its
// role's numbers, is read back through the second; the metrics endpoint
// serves the host's and the DHT's metrics; Close stops everything, with no
// goroutine left behind.
func TestTwoNodes(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent(), libp2pGlobal)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	ckpt := filepath.Join(t.TempDir(), "ckpt", "a")
	var logA syncBuffer
	reached := make(chan p2p.Reach, 1)
	a, err := New(ctx, Config{
		Net: loopback, MetricsAddr: "127.0.0.1:0", CheckpointDir: ckpt, ServeDialback: true,
		Status: StatusConfig{Role: metrics.RoleDHT, Region: "eu", Every: 200 * time.Millisecond},
		OnReach: func(r p2p.Reach) {
			select {
			case reached <- r:
			default:
			}
		},
		Log: &logA,
	})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	if fi, err := os.Stat(ckpt); err != nil || !fi.IsDir() || a.CheckpointDir() != ckpt {
		t.Fatalf("checkpoint directory %q: %v", a.CheckpointDir(), err)
	}
	if !strings.Contains(logA.String(), "metrics on "+a.MetricsURL()) {
		t.Errorf("log %q does not say where the metrics are", logA.String())
	}
	select {
	case r := <-reached:
		if len(r.Addrs) == 0 {
			t.Errorf("reach without addresses: %+v", r)
		}
	case <-ctx.Done():
		t.Fatal("OnReach was never called")
	}
	if err := a.StartStatus(func(s *metrics.Status) {
		s.Step = 7
		s.DHT = &metrics.DHTStatus{Peers: len(a.DHT().Peers()), Records: a.DHT().Records()}
	}); err != nil {
		t.Fatal(err)
	}
	if err := a.StartStatus(nil); err == nil {
		t.Error("a second StartStatus succeeded")
	}

	b, err := New(ctx, Config{Net: loopback, DHT: DHTConfig{Mode: DHTClient, Bootstrap: BootstrapAddrs([]peer.AddrInfo{a.Host().AddrInfo()})}})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	if len(b.Seeds()) != 1 || b.Seeds()[0].ID != a.ID() {
		t.Fatalf("seeds %v, want %s", b.Seeds(), a.ID())
	}
	if _, err := b.DHT().Store(ctx, "node-test", "", []byte("v1"), time.Now().Add(time.Minute)); err != nil {
		t.Fatalf("store through the second node: %v", err)
	}
	items, err := a.DHT().Get(ctx, "node-test")
	if err != nil || string(items[""].Value) != "v1" {
		t.Fatalf("get on the first node: %v, %v", items, err)
	}

	var st metrics.Status
	for found := false; !found; {
		ss, _, err := metrics.ReadStatus(ctx, b.DHT(), time.Now())
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range ss {
			if s.Peer == a.ID().String() {
				st, found = s, true
			}
		}
		if !found {
			select {
			case <-ctx.Done():
				t.Fatal("the first node's status record never appeared")
			case <-time.After(50 * time.Millisecond):
			}
		}
	}
	if st.Role != metrics.RoleDHT || st.Region != "eu" || st.Step != 7 || st.DHT == nil {
		t.Errorf("status record %+v", st)
	}

	body := get(t, a.MetricsURL())
	for _, name := range []string{"go_goroutines", "skyhive_dht_", "skyhive_p2p_"} {
		if !strings.Contains(body, name) {
			t.Errorf("the metrics endpoint serves no %s", name)
		}
	}
	if b.MetricsURL() != "" || b.Metrics() != nil {
		t.Error("a node without metrics has a registerer or an endpoint")
	}

	url := a.MetricsURL()
	if err := b.Close(); err != nil {
		t.Errorf("close: %v", err)
	}
	if err := a.Close(); err != nil {
		t.Errorf("close: %v", err)
	}
	if err := a.Close(); err != nil {
		t.Errorf("second close: %v", err)
	}
	if err := a.StartStatus(nil); err == nil {
		t.Error("StartStatus after Close succeeded")
	}
	if _, err := http.Get(url); err == nil {
		t.Error("the metrics endpoint still serves after Close")
	}
}

func get(t *testing.T, url string) string {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestJoinFailure: a node that cannot reach its bootstrap peer fails to
// start, saying why, and leaves nothing running; with an optional DHT it
// starts and says so on its log.
func TestJoinFailure(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent(), libp2pGlobal)
	ctx := context.Background()
	// A peer ID whose node does not run, at an address nobody listens on.
	gone, err := New(ctx, Config{Net: loopback, DHT: DHTConfig{Mode: DHTOff}})
	if err != nil {
		t.Fatal(err)
	}
	seed := BootstrapAddrs([]peer.AddrInfo{gone.Host().AddrInfo()})
	if gone.DHT() != nil {
		t.Error("a node with the DHT off has a DHT node")
	}
	gone.Close()

	cfg := Config{Net: loopback, DHT: DHTConfig{Bootstrap: seed, JoinTimeout: 2 * time.Second}}
	_, err = New(ctx, cfg)
	if !errors.Is(err, ErrJoin) || !strings.Contains(err.Error(), seed[0]) || !strings.Contains(err.Error(), "check the address") {
		t.Fatalf("join through a stopped node: %v, want the address and what to check", err)
	}
	var log syncBuffer
	cfg.DHT.Optional, cfg.Log = true, &log
	n, err := New(ctx, cfg)
	if err != nil {
		t.Fatalf("optional DHT: %v", err)
	}
	for deadline := time.Now().Add(10 * time.Second); !strings.Contains(log.String(), ErrJoin.Error()); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("log %q does not report the failed join", log.String())
		}
	}
	if err := n.Close(); err != nil {
		t.Error(err)
	}
}

func TestBadConfigRefused(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "file")
	if err := os.WriteFile(file, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	seed := "/ip4/127.0.0.1/tcp/4001/p2p/12D3KooWGzxzKZYveHXtpG6AsrUJBcWxHBFS2HsEoGTxrMLvKXtf"
	for _, tc := range []struct {
		name string
		cfg  Config
		want string
	}{
		{"unknown DHT mode", Config{DHT: DHTConfig{Mode: "both"}}, "DHT mode"},
		{"client without bootstrap", Config{DHT: DHTConfig{Mode: DHTClient}}, "needs bootstrap peers"},
		{"bootstrap without /p2p", Config{DHT: DHTConfig{Bootstrap: []string{"/ip4/127.0.0.1/tcp/4001"}}}, "/p2p/PEER_ID"},
		{"bootstrap with the DHT off", Config{DHT: DHTConfig{Mode: DHTOff, Bootstrap: []string{seed}}}, "DHT off"},
		{"negative join timeout", Config{DHT: DHTConfig{JoinTimeout: -time.Second}}, "negative"},
		{"status too often", Config{Status: StatusConfig{Role: metrics.RolePeer, Every: time.Millisecond}}, "status every"},
		{"status of no role", Config{Status: StatusConfig{Role: "oracle", Every: time.Second}}, "status role"},
		{"region not text", Config{Status: StatusConfig{Role: metrics.RolePeer, Region: "eu\n", Every: time.Second}}, "region"},
		{"status without a DHT", Config{DHT: DHTConfig{Mode: DHTOff}, Status: StatusConfig{Role: metrics.RolePeer, Every: time.Second}}, "DHT, which is off"},
		{"reachability", Config{Net: NetConfig{Reachability: "sometimes"}}, "reachability"},
		{"relay without /p2p", Config{Net: NetConfig{Relays: []string{"/ip4/127.0.0.1/tcp/1"}}}, "relay"},
		{"secret and key", Config{Net: NetConfig{SwarmSecret: file, SwarmKey: file, MemberToken: file}}, "choose one"},
		{"key without token", Config{Net: NetConfig{SwarmKey: file}}, "swarm_key needs member_token"},
		{"token without key", Config{Net: NetConfig{MemberToken: file}}, "member_token needs swarm_key"},
		{"Net and Host", Config{Net: loopback, Host: &p2p.Config{}}, "not both"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := New(context.Background(), tc.cfg)
			if !errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %v, want a configuration error about %q", err, tc.want)
			}
		})
	}
	// Files are read by New: a swarm secret that is no secret.
	_, err := New(context.Background(), Config{Net: NetConfig{Listen: loopback.Listen, SwarmSecret: file}})
	if err == nil || !strings.Contains(err.Error(), "swarm_secret") {
		t.Fatalf("empty swarm secret file: %v", err)
	}
	// A checkpoint directory that cannot be made.
	_, err = New(context.Background(), Config{Net: loopback, CheckpointDir: filepath.Join(file, "ckpt")})
	if err == nil || !strings.Contains(err.Error(), "checkpoint directory") {
		t.Fatalf("checkpoint directory under a file: %v", err)
	}
}

// TestConfigJSON: a configuration survives JSON, as a launcher hands it
// to a child process; in-process settings stay behind.
func TestConfigJSON(t *testing.T) {
	cfg := Config{
		Net: NetConfig{Listen: []string{"/ip4/127.0.0.1/tcp/0"}, Identity: "id.key", HolePunching: true, AutoNAT: true,
			Reachability: "private", SwarmKey: "swarm.pub", MemberToken: "member.token", MemoryBudget: 1 << 30, MaxMessageBytes: 64 << 20},
		DHT:           DHTConfig{Mode: DHTClient, Bootstrap: []string{"/ip4/127.0.0.1/tcp/4001/p2p/12D3KooWGzxzKZYveHXtpG6AsrUJBcWxHBFS2HsEoGTxrMLvKXtf"}, JoinTimeout: 30 * time.Second, Optional: true},
		Status:        StatusConfig{Role: metrics.RoleWorker, Region: "us", Every: 15 * time.Second},
		MetricsAddr:   "127.0.0.1:9100",
		CheckpointDir: "ckpt",
		ServeDialback: true,
	}
	b, err := json.Marshal(cfg)
	if err != nil {
		t.Fatal(err)
	}
	var back Config
	if err := json.Unmarshal(b, &back); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(back, cfg) {
		t.Fatalf("round trip:\n%+v\nwant\n%+v", back, cfg)
	}
	cfg.Log, cfg.Host = io.Discard, &p2p.Config{}
	if b2, err := json.Marshal(cfg); err != nil || string(b2) != string(b) {
		t.Fatalf("in-process settings went into JSON: %s (%v)", b2, err)
	}
}

// TestHostConfig: an in-process host configuration is used as is, with
// the node's registerer unless it names its own.
func TestHostConfig(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent(), libp2pGlobal)
	hcfg := &p2p.Config{ListenAddrs: []string{"/ip4/127.0.0.1/tcp/0"}, MaxMessageBytes: 1 << 20}
	n, err := New(context.Background(), Config{Host: hcfg, MetricsAddr: "127.0.0.1:0", DHT: DHTConfig{Mode: DHTOff}})
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	if addrs := n.Host().AddrInfo().Addrs; len(addrs) == 0 || !strings.HasPrefix(addrs[0].String(), "/ip4/127.0.0.1/tcp/") {
		t.Errorf("host listens on %v, not the configured loopback", addrs)
	}
	if !strings.Contains(get(t, n.MetricsURL()), "skyhive_p2p_") {
		t.Error("the host does not report to the node's registry")
	}
	if hcfg.Metrics != nil {
		t.Error("New changed the caller's host configuration")
	}
	if n.DHT() != nil {
		t.Error("a node with the DHT off has a DHT node")
	}
}

// countingTransport counts the calls made through it.
type countingTransport struct {
	p2p.Transport
	mu    sync.Mutex
	calls int
}

func (c *countingTransport) Call(ctx context.Context, to peer.AddrInfo, proto protocol.ID, req []byte) ([]byte, error) {
	c.mu.Lock()
	c.calls++
	c.mu.Unlock()
	return c.Transport.Call(ctx, to, proto, req)
}

// TestDHTTransport: the DHT node's traffic goes through the transport
// DHTTransport wraps the host in; a failing wrapper fails New.
func TestDHTTransport(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent(), libp2pGlobal)
	ctx := context.Background()
	seed, err := New(ctx, Config{Net: loopback})
	if err != nil {
		t.Fatal(err)
	}
	defer seed.Close()
	var ct *countingTransport
	cfg := Config{Net: loopback, DHT: DHTConfig{Mode: DHTClient, Bootstrap: BootstrapAddrs([]peer.AddrInfo{seed.Host().AddrInfo()})},
		DHTTransport: func(tr p2p.Transport) (p2p.Transport, error) {
			ct = &countingTransport{Transport: tr}
			return ct, nil
		}}
	n, err := New(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := n.DHT().Store(ctx, "wrapped", "", []byte("x"), time.Now().Add(time.Minute)); err != nil {
		t.Fatal(err)
	}
	n.Close()
	if ct == nil || ct.calls == 0 {
		t.Fatal("the DHT node did not call through the wrapped transport")
	}
	cfg.DHTTransport = func(p2p.Transport) (p2p.Transport, error) { return nil, errors.New("no link") }
	if _, err := New(ctx, cfg); err == nil || !strings.Contains(err.Error(), "no link") {
		t.Fatalf("failing wrapper: %v", err)
	}
}
