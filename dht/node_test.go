package dht

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	kb "github.com/libp2p/go-libp2p-kbucket"
	"github.com/libp2p/go-libp2p/core/peer"
	"go.uber.org/goleak"

	"github.com/skyhive/skyhive/clock"
	"github.com/skyhive/skyhive/clock/clocktest"
	"github.com/skyhive/skyhive/p2p"
	"github.com/skyhive/skyhive/p2p/memnet"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m,
		// go-log's process-wide writer, started once by libp2p.
		goleak.IgnoreAnyFunction("github.com/ipfs/go-log/v2/writer.(*MirrorWriter).logRoutine"),
	)
}

type swarm struct {
	t     testing.TB
	net   *memnet.Network
	cfg   Config
	peers []*memnet.Peer
	nodes []*Node
	rng   *rand.Rand
}

// newSwarm starts n nodes on an in-memory network, each bootstrapping from
// a random earlier one.
func newSwarm(t testing.TB, n int, cfg Config) *swarm {
	t.Helper()
	s := &swarm{t: t, net: memnet.NewNetwork(), cfg: cfg, rng: rand.New(rand.NewPCG(1, 2))}
	t.Cleanup(s.close)
	for i := 0; i < n; i++ {
		s.add()
	}
	return s
}

func (s *swarm) add() *Node {
	s.t.Helper()
	p, err := s.net.NewPeer()
	if err != nil {
		s.t.Fatal(err)
	}
	cfg := s.cfg
	cfg.PrivKey = p.PrivKey()
	node, err := New(p, cfg)
	if err != nil {
		s.t.Fatal(err)
	}
	if len(s.nodes) > 0 {
		var seed peer.AddrInfo
		for tries := 0; tries < 100; tries++ {
			j := s.rng.IntN(len(s.peers))
			if s.net.Alive(s.peers[j].ID()) {
				seed = s.peers[j].AddrInfo()
				break
			}
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := node.Bootstrap(ctx, []peer.AddrInfo{seed}); err != nil {
			s.t.Fatalf("bootstrap node %d: %v", len(s.nodes), err)
		}
	}
	s.peers = append(s.peers, p)
	s.nodes = append(s.nodes, node)
	return node
}

func (s *swarm) close() {
	for _, n := range s.nodes {
		n.Close()
	}
	s.net.Close()
}

func ctxT(t testing.TB) context.Context { return clocktest.Context(t, 20*time.Second) }

func TestStoreGetAcrossNodes(t *testing.T) {
	s := newSwarm(t, 12, Config{BucketSize: 5, Replicas: 4})
	ctx := ctxT(t)
	exp := time.Now().Add(time.Minute)
	n, err := s.nodes[0].Store(ctx, "alpha", "", []byte("one"), exp)
	if err != nil || n < 1 {
		t.Fatalf("store: %d %v", n, err)
	}
	for i, node := range s.nodes {
		got, err := node.Get(ctx, "alpha")
		if err != nil {
			t.Fatalf("node %d get: %v", i, err)
		}
		if string(got[""].Value) != "one" || !got[""].Expiration.Equal(time.Unix(0, exp.UnixNano())) {
			t.Fatalf("node %d got %+v", i, got)
		}
	}
	if _, err := s.nodes[3].Get(ctx, "missing"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("missing key: %v", err)
	}
	// A fresher value wins; a staler one is refused everywhere.
	if _, err := s.nodes[5].Store(ctx, "alpha", "", []byte("two"), exp.Add(time.Second)); err != nil {
		t.Fatal(err)
	}
	if _, err := s.nodes[6].Store(ctx, "alpha", "", []byte("stale"), exp); !errors.Is(err, ErrRejected) {
		t.Fatalf("stale store: %v", err)
	}
	got, err := s.nodes[9].Get(ctx, "alpha")
	if err != nil || string(got[""].Value) != "two" {
		t.Fatalf("after update: %+v %v", got, err)
	}
}

func TestSubkeysMergeAndUpdateByExpiration(t *testing.T) {
	s := newSwarm(t, 10, Config{BucketSize: 5})
	ctx := ctxT(t)
	now := time.Now()
	for i := 0; i < 4; i++ {
		if _, err := s.nodes[i].Store(ctx, "experts", fmt.Sprintf("e%d", i), []byte(fmt.Sprint(i)), now.Add(time.Minute)); err != nil {
			t.Fatal(err)
		}
	}
	// e1 updated by its writer with a later expiration; another peer
	// cannot take it over; an older write to e2 loses.
	if _, err := s.nodes[1].Store(ctx, "experts", "e1", []byte("new"), now.Add(2*time.Minute)); err != nil {
		t.Fatal(err)
	}
	if _, err := s.nodes[7].Store(ctx, "experts", "e1", []byte("hijack"), now.Add(3*time.Minute)); !errors.Is(err, ErrRejected) {
		t.Fatalf("another peer's subkey write: %v", err)
	}
	if _, err := s.nodes[8].Store(ctx, "experts", "e2", []byte("old"), now.Add(30*time.Second)); !errors.Is(err, ErrRejected) {
		t.Fatalf("older subkey write: %v", err)
	}
	got, err := s.nodes[9].Get(ctx, "experts")
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{"e0": "0", "e1": "new", "e2": "2", "e3": "3"}
	if len(got) != len(want) {
		t.Fatalf("got %d subkeys: %v", len(got), got)
	}
	for k, v := range want {
		if string(got[k].Value) != v {
			t.Fatalf("subkey %s = %q, want %q", k, got[k].Value, v)
		}
	}
}

var epoch = clocktest.Epoch

// eventually waits until cond holds: for work a fake-clock tick started in
// the nodes' background goroutines. It asserts no timing; the bound only
// turns a hang into a failure.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not after 10 s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

func TestRecordsExpireOnTime(t *testing.T) {
	clk := clock.NewFake(epoch)
	s := newSwarm(t, 6, Config{BucketSize: 4, Clock: clk})
	ctx := ctxT(t)
	ttl := 300 * time.Millisecond
	start := clk.Now()
	if _, err := s.nodes[0].Store(ctx, "short", "", []byte("v"), start.Add(ttl)); err != nil {
		t.Fatal(err)
	}
	if _, err := s.nodes[0].Store(ctx, "long", "", []byte("v"), start.Add(time.Minute)); err != nil {
		t.Fatal(err)
	}
	if _, err := s.nodes[3].Get(ctx, "short"); err != nil {
		t.Fatalf("before expiry: %v", err)
	}
	clk.Advance(ttl - time.Nanosecond)
	if _, err := s.nodes[2].Get(ctx, "short"); err != nil {
		t.Fatalf("a nanosecond before expiry: %v", err)
	}
	clk.Advance(time.Nanosecond)
	for i, n := range s.nodes {
		if got, err := n.Get(ctx, "short"); !errors.Is(err, ErrNotFound) {
			t.Fatalf("node %d at expiry: %v %v", i, got, err)
		}
	}
	if _, err := s.nodes[4].Get(ctx, "long"); err != nil {
		t.Fatalf("unexpired record: %v", err)
	}
	for _, n := range s.nodes {
		n.Cleanup()
		n.mu.Lock()
		if n.store.get("short", clk.Now().UnixNano()) != nil || n.store.Len() > 1 {
			t.Errorf("node kept %d items after cleanup", n.store.Len())
		}
		n.mu.Unlock()
	}
	if _, err := s.nodes[1].Store(ctx, "past", "", []byte("v"), clk.Now().Add(-time.Second)); !errors.Is(err, ErrExpired) {
		t.Fatalf("store in the past: %v", err)
	}
	if _, err := s.nodes[1].Store(ctx, "now", "", []byte("v"), clk.Now()); !errors.Is(err, ErrExpired) {
		t.Fatalf("store expiring now: %v", err)
	}
	if _, err := s.nodes[1].Store(ctx, "far", "", []byte("v"), clk.Now().Add(31*24*time.Hour)); err == nil {
		t.Fatal("store beyond MaxTTL accepted")
	}
	if _, err := s.nodes[1].Store(ctx, "big", "", make([]byte, 65<<10), clk.Now().Add(time.Second)); !errors.Is(err, ErrTooLarge) {
		t.Fatalf("oversized value: %v", err)
	}
}

// TestCleanupTimer checks that the periodic cleanup runs on the node's
// clock: expired records stay in storage (never returned) until the
// cleanup tick, and are dropped at it.
func TestCleanupTimer(t *testing.T) {
	clk := clock.NewFake(epoch)
	s := newSwarm(t, 4, Config{BucketSize: 4, RefreshInterval: -1, RepublishInterval: -1, CleanupInterval: time.Minute, Clock: clk})
	ctx := ctxT(t)
	if err := clk.BlockUntil(ctx, len(s.nodes)); err != nil { // the cleanup tickers
		t.Fatal(err)
	}
	if _, err := s.nodes[0].Store(ctx, "brief", "", []byte("v"), clk.Now().Add(30*time.Second)); err != nil {
		t.Fatal(err)
	}
	stored := func() int {
		total := 0
		for _, n := range s.nodes {
			n.mu.Lock()
			total += n.store.Len()
			n.mu.Unlock()
		}
		return total
	}
	held := stored()
	if held == 0 {
		t.Fatal("no node stored the record")
	}
	clk.Advance(time.Minute - time.Nanosecond)
	if _, err := s.nodes[1].Get(ctx, "brief"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("expired record returned: %v", err)
	}
	if got := stored(); got != held {
		t.Fatalf("%d items before the cleanup tick, want %d", got, held)
	}
	clk.Advance(time.Nanosecond)
	eventually(t, "cleanup at the tick", func() bool { return stored() == 0 })
}

// TestRefreshTimerEvictsDeadPeers checks that the periodic refresh runs
// on the node's clock and evicts a peer that stopped answering.
func TestRefreshTimerEvictsDeadPeers(t *testing.T) {
	clk := clock.NewFake(epoch)
	s := newSwarm(t, 6, Config{BucketSize: 8, RPCTimeout: time.Second, RefreshInterval: 10 * time.Minute,
		RepublishInterval: -1, CleanupInterval: -1, Clock: clk})
	ctx := ctxT(t)
	if err := clk.BlockUntil(ctx, len(s.nodes)); err != nil { // the refresh tickers
		t.Fatal(err)
	}
	dead := s.peers[5].ID()
	has := func(n *Node) bool { return slices.Contains(n.Peers(), dead) }
	if !has(s.nodes[0]) {
		t.Fatal("node 0 does not know node 5: test is not testing")
	}
	_ = s.net.Kill(dead)
	clk.Advance(10*time.Minute - time.Nanosecond)
	if !has(s.nodes[0]) {
		t.Fatal("node 0 dropped node 5 before its refresh")
	}
	clk.Advance(time.Nanosecond)
	eventually(t, "eviction at the refresh tick", func() bool { return !has(s.nodes[0]) })
}

func TestSignedRecordForgeryRejected(t *testing.T) {
	s := newSwarm(t, 8, Config{BucketSize: 8})
	ctx := ctxT(t)
	owner, evil := s.nodes[0], s.nodes[1]
	key := "server" + OwnerMarker(owner.ID())
	exp := time.Now().Add(time.Minute)
	if _, err := owner.Store(ctx, key, "", []byte("honest"), exp); err != nil {
		t.Fatal(err)
	}
	// The API refuses to write another peer's record.
	if _, err := evil.Store(ctx, key, "", []byte("evil"), exp.Add(time.Hour)); !errors.Is(err, ErrNotOwner) {
		t.Fatalf("evil Store: %v", err)
	}
	// A hand-made STORE with a later expiration and a signature by the
	// wrong key is refused by every node.
	forged := &entry{Key: key, Value: []byte("evil"), Expiration: exp.Add(time.Hour).UnixNano()}
	forged.Signature, _ = s.peers[1].PrivKey().Sign(signedBytes(forged))
	req, err := encodeRequest(&request{Type: msgStore, Entries: []*entry{forged}})
	if err != nil {
		t.Fatal(err)
	}
	for i, p := range s.peers[2:] {
		raw, err := s.peers[1].Call(ctx, p.AddrInfo(), ProtocolID, req)
		if err != nil {
			t.Fatal(err)
		}
		resp, err := decodeResponse(raw)
		if err != nil || len(resp.Accepted) != 1 || resp.Accepted[0] {
			t.Fatalf("node %d accepted forged record: %+v %v", i+2, resp, err)
		}
	}
	// Even if a replica is corrupted, readers verify what they get.
	for _, n := range s.nodes[2:5] {
		n.mu.Lock()
		n.store.dropKey(key)
		_ = n.store.put(forged, time.Now().UnixNano())
		n.mu.Unlock()
	}
	for i, n := range s.nodes {
		if i >= 2 && i < 5 {
			continue // their own storage is the corrupted one
		}
		got, err := n.Get(ctx, key)
		if err != nil || string(got[""].Value) != "honest" {
			t.Fatalf("node %d read %+v %v", i, got, err)
		}
	}
	// The owner can still update its record.
	if _, err := owner.Store(ctx, key, "", []byte("v2"), exp.Add(2*time.Hour)); err != nil {
		t.Fatal(err)
	}
	if got, err := s.nodes[6].Get(ctx, key); err != nil || string(got[""].Value) != "v2" {
		t.Fatalf("owner update: %+v %v", got, err)
	}
}

func TestHostileRequestsDoNotHurt(t *testing.T) {
	s := newSwarm(t, 4, Config{BucketSize: 4})
	ctx := ctxT(t)
	rng := rand.New(rand.NewPCG(3, 4))
	for i := 0; i < 200; i++ {
		junk := make([]byte, rng.IntN(64))
		for j := range junk {
			junk[j] = byte(rng.UintN(256))
		}
		if i%2 == 0 && len(junk) > 2 {
			junk[0], junk[1] = wireVersion, byte(1+rng.IntN(4))
		}
		_, err := s.peers[0].Call(ctx, s.peers[1].AddrInfo(), ProtocolID, junk)
		var re *p2p.RemoteError
		if err != nil && !errors.As(err, &re) {
			t.Fatalf("transport error on junk: %v", err)
		}
	}
	if _, err := s.nodes[1].Store(ctx, "still", "", []byte("ok"), time.Now().Add(time.Minute)); err != nil {
		t.Fatal(err)
	}
	if _, err := s.nodes[2].Get(ctx, "still"); err != nil {
		t.Fatal(err)
	}
}

func TestClientMode(t *testing.T) {
	s := newSwarm(t, 6, Config{BucketSize: 4})
	ctx := ctxT(t)
	p, err := s.net.NewPeer()
	if err != nil {
		t.Fatal(err)
	}
	c, err := New(p, Config{ClientMode: true, BucketSize: 4})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := c.Bootstrap(ctx, []peer.AddrInfo{s.peers[0].AddrInfo()}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Store(ctx, "from-client", "", []byte("x"), time.Now().Add(time.Minute)); err != nil {
		t.Fatal(err)
	}
	if _, err := s.nodes[5].Get(ctx, "from-client"); err != nil {
		t.Fatal(err)
	}
	for i, n := range s.nodes {
		for _, id := range n.Peers() {
			if id == c.ID() {
				t.Fatalf("node %d added the client to its table", i)
			}
		}
	}
}

func TestRepublishRestoresLostReplicas(t *testing.T) {
	clk := clock.NewFake(epoch)
	const every = 15 * time.Minute
	s := newSwarm(t, 20, Config{BucketSize: 6, Replicas: 3, Quorum: 1, RPCTimeout: time.Second,
		RefreshInterval: -1, RepublishInterval: every, CleanupInterval: -1, Clock: clk})
	ctx := ctxT(t)
	if err := clk.BlockUntil(ctx, len(s.nodes)); err != nil { // the republish tickers
		t.Fatal(err)
	}
	key := "survivor"
	// The owner and the reader are the nodes farthest from the key, so
	// only the nearest replicas hold the record.
	ids := make([]peer.ID, len(s.peers))
	byID := make(map[peer.ID]*Node)
	for i, p := range s.peers {
		ids[i] = p.ID()
		byID[p.ID()] = s.nodes[i]
	}
	sorted := kb.SortClosestPeers(ids, kb.ConvertKey(key))
	owner, reader := byID[sorted[len(sorted)-1]], byID[sorted[len(sorted)-2]]
	if _, err := owner.Store(ctx, key, "", []byte("v"), clk.Now().Add(time.Hour)); err != nil {
		t.Fatal(err)
	}
	var holders []int
	for i, n := range s.nodes {
		n.mu.Lock()
		if n.store.get(key, clk.Now().UnixNano()) != nil && n != owner {
			holders = append(holders, i)
		}
		n.mu.Unlock()
	}
	if len(holders) == 0 {
		t.Fatal("no replica holds the record")
	}
	for _, i := range holders {
		_ = s.net.Kill(s.peers[i].ID())
	}
	if got, err := reader.Get(ctx, key); !errors.Is(err, ErrNotFound) {
		t.Fatalf("record survived without republish (%v %v): test is not testing", got, err)
	}
	// Nothing is republished before the interval...
	clk.Advance(every - time.Nanosecond)
	if got, err := reader.Get(ctx, key); !errors.Is(err, ErrNotFound) {
		t.Fatalf("record back before the republish tick: %v %v", got, err)
	}
	// ...and the owner's timer republishes at it.
	clk.Advance(time.Nanosecond)
	eventually(t, "record back after the republish tick", func() bool {
		_, err := reader.Get(ctx, key)
		return err == nil
	})
	// Republish also works on demand.
	if k, err := owner.Republish(ctx); err != nil || k != 1 {
		t.Fatalf("republish: %d %v", k, err)
	}
}

func TestChurn(t *testing.T) {
	n := 120
	if testing.Short() {
		n = 60
	}
	s := newSwarm(t, n, Config{RPCTimeout: time.Second})
	// This test runs on the wall clock (its lookups wait out real RPC
	// timeouts to dead peers) and asserts no timing: the deadline only
	// guards against a hang. Its hundreds of lookups share one context, so
	// the guard is longer than ctxT's: under -race on a loaded 2-core
	// machine they took more than 20 s.
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	keys := 40
	exp := time.Now().Add(time.Hour)
	for i := 0; i < keys; i++ {
		w := s.nodes[s.rng.IntN(len(s.nodes))]
		if _, err := w.Store(ctx, fmt.Sprintf("key-%d", i), "", []byte(fmt.Sprint(i)), exp); err != nil {
			t.Fatalf("store %d: %v", i, err)
		}
	}
	// Kill 20% without warning, add 20% new nodes.
	perm := s.rng.Perm(n)
	for _, i := range perm[:n/5] {
		_ = s.net.Kill(s.peers[i].ID())
	}
	for i := 0; i < n/5; i++ {
		s.add()
	}
	alive := func() *Node {
		for {
			i := s.rng.IntN(len(s.nodes))
			if s.net.Alive(s.peers[i].ID()) {
				return s.nodes[i]
			}
		}
	}
	for i := 0; i < keys; i++ {
		got, err := alive().Get(ctx, fmt.Sprintf("key-%d", i))
		if err != nil || string(got[""].Value) != fmt.Sprint(i) {
			t.Fatalf("key %d after churn: %v %v", i, got, err)
		}
	}
	// The network keeps serving new writes, read by the newcomers.
	for i := 0; i < 10; i++ {
		if _, err := alive().Store(ctx, fmt.Sprintf("new-%d", i), "", []byte("x"), exp); err != nil {
			t.Fatal(err)
		}
	}
	for i := 0; i < 10; i++ {
		if _, err := s.nodes[n+i%(n/5)].Get(ctx, fmt.Sprintf("new-%d", i)); err != nil {
			t.Fatalf("new key %d: %v", i, err)
		}
	}
	// Lookups converge: every alive node's table is populated and a
	// FIND_NODE finds the truly closest alive peers.
	var live []peer.ID
	for i, p := range s.peers {
		if s.net.Alive(p.ID()) {
			live = append(live, p.ID())
			if len(s.nodes[i].Peers()) < 10 {
				t.Fatalf("node %d has %d peers", i, len(s.nodes[i].Peers()))
			}
		}
	}
	q := alive()
	got, st, err := q.ClosestPeers(ctx, "probe")
	if err != nil || len(got) < 5 {
		t.Fatalf("%d peers, %v", len(got), err)
	}
	t.Logf("closest-peer lookup: %+v", st)
	others := slices.DeleteFunc(live, func(id peer.ID) bool { return id == q.ID() })
	want := kb.SortClosestPeers(others, kb.ConvertKey("probe"))
	for i := 0; i < 5; i++ {
		if got[i].ID != want[i] {
			t.Fatalf("closest[%d] is not the true closest alive peer", i)
		}
	}
	if st.Hops > 6 {
		t.Errorf("lookup took %d hops in a %d-node network", st.Hops, len(s.nodes))
	}
}
