package dht

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	kb "github.com/libp2p/go-libp2p-kbucket"
	"github.com/libp2p/go-libp2p/core/peer"
	ma "github.com/multiformats/go-multiaddr"

	"github.com/skyhive/skyhive/p2p/memnet"
)

// seenAt wraps a memnet peer with the remote addresses a real transport
// would observe for each caller.
type seenAt struct {
	*memnet.Peer
	mu sync.Mutex
	at map[peer.ID]ma.Multiaddr
}

func (s *seenAt) RemoteAddrs(p peer.ID) []ma.Multiaddr {
	s.mu.Lock()
	defer s.mu.Unlock()
	if a, ok := s.at[p]; ok {
		return []ma.Multiaddr{a}
	}
	return nil
}

func (s *seenAt) set(p peer.ID, ip string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.at[p] = ma.StringCast("/ip4/" + ip + "/tcp/4001")
}

// newVictim starts a node whose transport reports callers' addresses.
func newVictim(t *testing.T, net *memnet.Network, cfg Config) (*Node, *seenAt) {
	t.Helper()
	p, err := net.NewPeer()
	if err != nil {
		t.Fatal(err)
	}
	w := &seenAt{Peer: p, at: map[peer.ID]ma.Multiaddr{}}
	n, err := New(w, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n.Close() })
	return n, w
}

// rawCall sends one hand-made request and decodes the answer.
func rawCall(ctx context.Context, t *testing.T, from *memnet.Peer, to peer.AddrInfo, r *request) *response {
	t.Helper()
	req, err := encodeRequest(r)
	if err != nil {
		t.Fatal(err)
	}
	raw, err := from.Call(ctx, to, ProtocolID, req)
	if err != nil {
		t.Fatalf("call: %v", err)
	}
	resp, err := decodeResponse(raw)
	if err != nil {
		t.Fatal(err)
	}
	return resp
}

// TestEraseDictionaryAttack replays issue 13's attack: a plain value put
// under the prefix key that servers declare subkeys under, with a far
// expiration, through the API (as `skyhive dht put` does) and by hand to
// every node. Nothing accepts it, every node still reads the experts, and
// the servers' next declarations are accepted.
func TestEraseDictionaryAttack(t *testing.T) {
	s := newSwarm(t, 10, Config{BucketSize: 5})
	ctx := ctxT(t)
	now := time.Now()
	declare := func(exp time.Time) {
		t.Helper()
		for i := range 4 {
			if k, err := s.nodes[i].Store(ctx, "ffn.", fmt.Sprint(i), []byte(fmt.Sprint("expert", i)), exp); err != nil || k == 0 {
				t.Fatalf("declare %d: %d %v", i, k, err)
			}
		}
	}
	declare(now.Add(time.Minute))
	// Through the API from a client node, as the CLI does.
	p, err := s.net.NewPeer()
	if err != nil {
		t.Fatal(err)
	}
	c, err := New(p, Config{ClientMode: true, BucketSize: 5})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := c.Bootstrap(ctx, []peer.AddrInfo{s.peers[0].AddrInfo()}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Store(ctx, "ffn.", "", []byte("x"), now.Add(DefaultMaxTTL-time.Minute)); !errors.Is(err, ErrRejected) {
		t.Fatalf("plain put over the prefix dictionary: %v", err)
	}
	if _, err := c.Store(ctx, "ffn.", "", []byte("x"), now.Add(700*time.Hour)); !errors.Is(err, ErrTTL) {
		t.Fatalf("put --ttl 700h: %v", err)
	}
	// By hand, to every node, with the longest expiration they allow.
	evil := &entry{Key: "ffn.", Value: []byte("x"), Expiration: now.Add(DefaultMaxTTL).UnixNano()}
	for i := range s.nodes {
		resp := rawCall(ctx, t, p, s.peers[i].AddrInfo(), &request{Type: msgStore, Client: true, Entries: []*entry{evil}})
		if resp.Accepted[0] {
			t.Fatalf("node %d accepted the plain value", i)
		}
		resp = rawCall(ctx, t, p, s.peers[i].AddrInfo(), &request{Type: msgStore, Client: true, Cache: true, Entries: []*entry{evil}})
		if resp.Accepted[0] {
			t.Fatalf("node %d cached the plain value", i)
		}
	}
	// The servers' next round is accepted, and everyone reads the experts.
	declare(now.Add(2 * time.Minute))
	for i, n := range s.nodes {
		got, err := n.Get(ctx, "ffn.")
		if err != nil || len(got) != 4 || string(got["3"].Value) != "expert3" {
			t.Fatalf("node %d reads %v %v", i, got, err)
		}
	}
	// A plain value put first does not keep the servers out either.
	if _, err := c.Store(ctx, "moe.", "", []byte("squat"), now.Add(time.Hour)); err != nil {
		t.Fatal(err)
	}
	if _, err := s.nodes[0].Store(ctx, "moe.", "0", []byte("expert"), now.Add(time.Minute)); err != nil {
		t.Fatalf("declare over a squatted key: %v", err)
	}
	if got, err := s.nodes[7].Get(ctx, "moe."); err != nil || len(got) != 1 || string(got["0"].Value) != "expert" {
		t.Fatalf("squatted key reads %v %v", got, err)
	}
}

// TestFarFutureRecordsRefused checks the expiration cap on every replica.
func TestFarFutureRecordsRefused(t *testing.T) {
	s := newSwarm(t, 4, Config{BucketSize: 4, MaxTTL: time.Hour})
	ctx := ctxT(t)
	now := time.Now()
	if _, err := s.nodes[0].Store(ctx, "k", "", []byte("v"), now.Add(time.Hour+time.Second)); !errors.Is(err, ErrTTL) {
		t.Fatalf("Store beyond MaxTTL: %v", err)
	}
	ok := &entry{Key: "k", Value: []byte("v"), Expiration: now.Add(time.Hour + MaxClockSkew/2).UnixNano()}
	far := &entry{Key: "j", Value: []byte("v"), Expiration: now.Add(time.Hour + 2*MaxClockSkew).UnixNano()}
	for i := 1; i < 4; i++ {
		resp := rawCall(ctx, t, s.peers[0], s.peers[i].AddrInfo(), &request{Type: msgStore, Entries: []*entry{ok, far}})
		if !resp.Accepted[0] || resp.Accepted[1] {
			t.Fatalf("node %d accepted %v (skewed, far)", i, resp.Accepted)
		}
	}
}

// TestStoreFloodFromOnePeer floods a node with STOREs from one identity:
// it keeps only that peer's quota and goes on serving honest peers.
func TestStoreFloodFromOnePeer(t *testing.T) {
	s := newSwarm(t, 4, Config{BucketSize: 4, MaxRecords: 400, CacheSize: -1})
	ctx := ctxT(t)
	victim := s.nodes[1]
	attacker, err := s.net.NewPeer()
	if err != nil {
		t.Fatal(err)
	}
	exp := time.Now().Add(time.Hour).UnixNano()
	for b := range 8 {
		es := make([]*entry, MaxStoreBatch)
		for i := range es {
			es[i] = &entry{Key: fmt.Sprint("junk", b, ".", i), Value: make([]byte, 100), Expiration: exp}
		}
		rawCall(ctx, t, attacker, s.peers[1].AddrInfo(), &request{Type: msgStore, Client: true, Entries: es})
	}
	if got := victim.Records(); got != 100 {
		t.Fatalf("victim stores %d records from one peer, quota 100", got)
	}
	if _, err := s.nodes[0].Store(ctx, "honest", "", []byte("v"), time.Now().Add(time.Minute)); err != nil {
		t.Fatal(err)
	}
	if got, err := victim.Get(ctx, "honest"); err != nil || string(got[""].Value) != "v" {
		t.Fatalf("victim reads %v %v", got, err)
	}
	victim.mu.Lock()
	held := victim.store.get("honest", time.Now().UnixNano())
	victim.mu.Unlock()
	if len(held) != 1 {
		t.Fatal("victim refused the honest record")
	}
}

// TestStoreFloodFromOneAddress floods a node from many identities behind
// one public address: together they keep only the address's quota.
func TestStoreFloodFromOneAddress(t *testing.T) {
	net := memnet.NewNetwork()
	defer net.Close()
	victim, w := newVictim(t, net, Config{BucketSize: 4, MaxRecords: 400, CacheSize: -1})
	ctx := ctxT(t)
	exp := time.Now().Add(time.Hour).UnixNano()
	for id := range 20 {
		sybil, err := net.NewPeer()
		if err != nil {
			t.Fatal(err)
		}
		w.set(sybil.ID(), "203.0.113.7")
		es := make([]*entry, 100)
		for i := range es {
			es[i] = &entry{Key: fmt.Sprint("junk", id, ".", i), Value: []byte("x"), Expiration: exp}
		}
		rawCall(ctx, t, sybil, w.AddrInfo(), &request{Type: msgStore, Client: true, Entries: es})
	}
	if got := victim.Records(); got != 200 {
		t.Fatalf("one address stores %d records, quota 200", got)
	}
	// An honest peer elsewhere still stores.
	honest, err := net.NewPeer()
	if err != nil {
		t.Fatal(err)
	}
	w.set(honest.ID(), "198.51.100.1")
	resp := rawCall(ctx, t, honest, w.AddrInfo(), &request{Type: msgStore, Client: true, Entries: []*entry{{Key: "h", Value: []byte("v"), Expiration: exp}}})
	if !resp.Accepted[0] {
		t.Fatal("honest record refused")
	}
}

// TestStoreOnlyWhenAmongClosest checks that a node stores records only for
// keys it is a replica of, and refuses copies pushed for caching.
func TestStoreOnlyWhenAmongClosest(t *testing.T) {
	s := newSwarm(t, 16, Config{BucketSize: 3})
	ctx := ctxT(t)
	var far *Node
	var key string
	for i := 0; far == nil; i++ {
		key = fmt.Sprint("key", i)
		for _, n := range s.nodes[1:] {
			if !n.amongClosest(key) {
				far = n
				break
			}
		}
	}
	near := key
	for i := 0; !far.amongClosest(near); i++ {
		near = fmt.Sprint("near", i)
	}
	before := far.Records()
	exp := time.Now().Add(time.Minute).UnixNano()
	es := []*entry{{Key: key, Subkey: "s", Value: []byte("v"), Expiration: exp}, {Key: near, Value: []byte("v"), Expiration: exp}}
	resp := rawCall(ctx, t, s.peers[0], far.t.AddrInfo(), &request{Type: msgStore, Client: true, Entries: es})
	if resp.Accepted[0] || !resp.Accepted[1] {
		t.Fatalf("accepted %v (far key, own key)", resp.Accepted)
	}
	es[1] = &entry{Key: near + "/2", Value: []byte("v"), Expiration: exp}
	resp = rawCall(ctx, t, s.peers[0], far.t.AddrInfo(), &request{Type: msgStore, Client: true, Cache: true, Entries: es[1:]})
	if resp.Accepted[0] {
		t.Fatal("copy pushed for caching accepted")
	}
	far.mu.Lock()
	cached := far.cache.Len()
	far.mu.Unlock()
	if far.Records() != before+1 || cached != 0 {
		t.Fatalf("records %d→%d, cached %d", before, far.Records(), cached)
	}
}

// TestRoutingTableSybilFlood pings a node from hundreds of identities: from
// one address, from one /24, and from many subnets. Each bucket keeps at
// most MaxPeersPerIP of one address and MaxPeersPerSubnet of one subnet,
// the peers it knew before stay, and the node keeps serving.
func TestRoutingTableSybilFlood(t *testing.T) {
	net := memnet.NewNetwork()
	defer net.Close()
	cfg := Config{BucketSize: 8, RefreshInterval: -1}
	victim, w := newVictim(t, net, cfg)
	ctx := ctxT(t)
	ping := func(ip string) peer.ID {
		p, err := net.NewPeer()
		if err != nil {
			t.Fatal(err)
		}
		w.set(p.ID(), ip)
		rawCall(ctx, t, p, w.AddrInfo(), &request{Type: msgPing})
		return p.ID()
	}
	var honest []peer.ID
	for i := range 12 {
		honest = append(honest, ping(fmt.Sprintf("198.51.%d.1", i)))
	}
	before := victim.Peers()
	sameIP, sameNet := map[peer.ID]bool{}, map[peer.ID]bool{}
	for i := range 200 {
		sameIP[ping("203.0.113.7")] = true
		sameNet[ping(fmt.Sprintf("192.0.2.%d", i%250+1))] = true
	}
	for i := range 200 {
		ping(fmt.Sprintf("45.%d.%d.1", i/200, i%200))
	}
	self := kb.ConvertPeerID(victim.ID())
	perBucket := func(set map[peer.ID]bool) map[int]int {
		m := map[int]int{}
		for _, id := range victim.Peers() {
			if set[id] {
				m[kb.CommonPrefixLen(kb.ConvertPeerID(id), self)]++
			}
		}
		return m
	}
	for cpl, c := range perBucket(sameIP) {
		if c > 2 {
			t.Fatalf("bucket %d holds %d peers of one address", cpl, c)
		}
	}
	for cpl, c := range perBucket(sameNet) {
		if c > 2 {
			t.Fatalf("bucket %d holds %d peers of one /24", cpl, c)
		}
	}
	for _, id := range before {
		if !slices.Contains(victim.Peers(), id) {
			t.Fatalf("long-lived peer %s pushed out of the table", id.ShortString())
		}
	}
	if len(before) < 8 || len(honest) != 12 {
		t.Fatalf("only %d honest peers in the table", len(before))
	}
	// The node still answers.
	hp, err := net.NewPeer()
	if err != nil {
		t.Fatal(err)
	}
	resp := rawCall(ctx, t, hp, w.AddrInfo(), &request{Type: msgFindNode, Target: kb.ConvertKey("x")})
	if len(resp.Peers) == 0 {
		t.Fatal("no peers in FIND_NODE answer")
	}
}

// TestPeerSubkeysOwned checks the averaging-style declarations, one subkey
// per peer ID: only that peer can write its subkey (its node signs without
// being told), forged or unsigned copies are refused by every node and
// ignored by readers.
func TestPeerSubkeysOwned(t *testing.T) {
	s := newSwarm(t, 8, Config{BucketSize: 8})
	ctx := ctxT(t)
	// A node configured without a key signs with its transport's.
	p, err := s.net.NewPeer()
	if err != nil {
		t.Fatal(err)
	}
	owner, err := New(p, Config{BucketSize: 8})
	if err != nil {
		t.Fatal(err)
	}
	defer owner.Close()
	if err := owner.Bootstrap(ctx, []peer.AddrInfo{s.peers[0].AddrInfo()}); err != nil {
		t.Fatal(err)
	}
	key, sub := "run/peers", owner.ID().String()
	exp := time.Now().Add(time.Minute)
	if _, err := owner.Store(ctx, key, sub, []byte("honest"), exp); err != nil {
		t.Fatal(err)
	}
	if _, err := s.nodes[1].Store(ctx, key, sub, []byte("evil"), exp.Add(time.Second)); !errors.Is(err, ErrNotOwner) {
		t.Fatalf("writing another peer's subkey: %v", err)
	}
	unsigned := &entry{Key: key, Subkey: sub, Value: []byte("evil"), Expiration: exp.Add(time.Second).UnixNano()}
	forged := *unsigned
	forged.Signature, _ = s.peers[1].PrivKey().Sign(signedBytes(&forged))
	for i := range s.nodes {
		resp := rawCall(ctx, t, s.peers[1], s.peers[i].AddrInfo(), &request{Type: msgStore, Client: true, Entries: []*entry{unsigned, &forged}})
		if resp.Accepted[0] || resp.Accepted[1] {
			t.Fatalf("node %d accepted %v (unsigned, forged)", i, resp.Accepted)
		}
	}
	// Its own subkey is the attacker's to write, and no one else's.
	if _, err := s.nodes[1].Store(ctx, key, s.nodes[1].ID().String(), []byte("mine"), exp); err != nil {
		t.Fatal(err)
	}
	for i, n := range s.nodes {
		got, err := n.Get(ctx, key)
		if err != nil || string(got[sub].Value) != "honest" || len(got) != 2 {
			t.Fatalf("node %d reads %v %v", i, got, err)
		}
	}
}

// TestCrowdingAKey replays issue 35's crowding attack: one stranger stores
// thousands of long-lived subkeys under a key that honest peers declare
// short-lived records under (an expert grid's prefix, the status key).
// Each replica keeps at most KeyWriterMaxRecords of them, and even without
// that bound a reader still gets every honest writer's record: answers are
// shared among writers, not sorted by expiration.
func TestCrowdingAKey(t *testing.T) {
	for _, c := range []struct {
		name  string
		limit int // KeyWriterMaxRecords
		kept  int // the attacker's items a replica keeps
	}{{"quota", 0, 256}, {"fair answers", -1, 6 * MaxStoreBatch}} {
		crowded := c.limit < 0 // without the quota the answers are full
		t.Run(c.name, func(t *testing.T) {
			s := newSwarm(t, 5, Config{BucketSize: 5, CacheSize: -1, KeyWriterMaxRecords: c.limit})
			ctx := ctxT(t)
			attacker, err := s.net.NewPeer()
			if err != nil {
				t.Fatal(err)
			}
			const key = "ffn."
			far := time.Now().Add(5 * time.Hour).UnixNano()
			for i, p := range s.peers {
				for b := range 6 {
					es := make([]*entry, MaxStoreBatch)
					for j := range es {
						es[j] = &entry{Key: key, Subkey: fmt.Sprintf("junk-%d-%d", b, j), Value: make([]byte, 3000), Expiration: far}
					}
					rawCall(ctx, t, attacker, p.AddrInfo(), &request{Type: msgStore, Client: true, Entries: es})
				}
				s.nodes[i].mu.Lock()
				held := len(s.nodes[i].store.get(key, time.Now().UnixNano()))
				s.nodes[i].mu.Unlock()
				if held != c.kept {
					t.Fatalf("replica %d keeps %d of the attacker's items, want %d", i, held, c.kept)
				}
			}
			for i := range 4 {
				if _, err := s.nodes[i].Store(ctx, key, fmt.Sprintf("server-%d", i), []byte("alive"), time.Now().Add(time.Minute)); err != nil {
					t.Fatal(err)
				}
			}
			got, st, err := s.nodes[4].GetStats(ctx, key)
			if err != nil {
				t.Fatal(err)
			}
			if st.Crowded != crowded {
				t.Errorf("the reader was told the key is crowded: %v, want %v", st.Crowded, crowded)
			}
			for i := range 4 {
				if _, ok := got[fmt.Sprintf("server-%d", i)]; !ok {
					t.Errorf("a reader sees %d items but not server-%d's declaration", len(got), i)
				}
			}
		})
	}
}

func TestFitItemsSharesAnswersAmongWriters(t *testing.T) {
	var es []*entry
	for i := range 3 * MaxItems {
		es = append(es, &entry{Subkey: fmt.Sprint("junk", i), Expiration: int64(1e18) + int64(i), from: "flooder"})
	}
	for i := range 3 {
		es = append(es, &entry{Subkey: fmt.Sprint("honest", i), Expiration: 1, writer: fmt.Sprint("w", i)})
	}
	fit, cut := fitItems(es)
	if !cut || len(fit) != MaxItems {
		t.Fatalf("%d items, cut %v; want MaxItems, cut", len(fit), cut)
	}
	for i, e := range fit[:3] {
		if e.writer == "" {
			t.Fatalf("answer item %d is the flooder's; the honest writers' items go first", i)
		}
	}
	if fit[3].Expiration != int64(1e18)+int64(3*MaxItems-1) {
		t.Error("a writer's freshest item comes first")
	}
	if fit, cut := fitItems(es[3*MaxItems:]); cut || len(fit) != 3 {
		t.Errorf("a small key: %d items, cut %v", len(fit), cut)
	}
}
