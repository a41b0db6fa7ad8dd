// Package dht is a Kademlia distributed hash table over p2p.Transport with
// the semantics of hivemind's DHT: string keys hashed into a 256-bit
// keyspace; values with an expiration time, where the latest expiration
// wins; optional subkeys that turn a key into a dictionary merged across
// replicas; records signed by their owner when a key or subkey contains an
// owner marker; replication to the k nearest peers found by iterative
// lookups with parallelism alpha; a cache of what the node's own lookups
// found; and periodic bucket refresh and republishing of the node's own
// records.
//
// The swarm is open, so a node trusts no peer: a plain value never
// replaces a dictionary; a subkey item is renewed only by the peer that
// signed it, and owner-marked records and peer-ID subkeys only by their
// owner; expirations are capped (MaxTTL); each peer and each address gets
// a share of the storage; a node stores only keys it is a replica of and
// refuses copies pushed for caching; the routing table keeps its
// long-lived peers and admits few peers per address and subnet per
// bucket; and every length on the wire is checked before allocation.
//
// The routing table is go-libp2p-kbucket's. The lookup state machine
// (lookup.go), storage (record.go), signatures (sign.go) and wire format
// (wire.go) are pure code; the I/O is in node.go (storing, getting,
// serving), routing.go (pings, refreshes, iterative lookups) and
// maintain.go (republishing, expiry, the background tickers).
package dht

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	kb "github.com/libp2p/go-libp2p-kbucket"
	"github.com/libp2p/go-libp2p/core/crypto"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/core/protocol"
	pstore "github.com/libp2p/go-libp2p/p2p/host/peerstore"
	ma "github.com/multiformats/go-multiaddr"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/skyhive/skyhive/clock"
	"github.com/skyhive/skyhive/p2p"
)

// ProtocolID is the DHT's protocol on a p2p.Transport.
const ProtocolID protocol.ID = "/skyhive/dht/1.0.0"

// Errors returned by Node methods.
var (
	// ErrNotFound means no live record exists under the key.
	ErrNotFound = errors.New("dht: not found")
	// ErrNoPeers means the routing table is empty and nothing could be
	// stored or looked up.
	ErrNoPeers = errors.New("dht: no peers")
	// ErrRejected means every replica refused the record, usually because
	// it holds a fresher one.
	ErrRejected = errors.New("dht: record rejected by all replicas")
	// ErrClosed means the node is closed.
	ErrClosed = errors.New("dht: node closed")
	// ErrTTL means a record expires further ahead than Config.MaxTTL.
	ErrTTL = errors.New("dht: expiration too far ahead")
)

// Config tunes a Node. Zero fields take the defaults shown; negative
// intervals or sizes disable the feature.
type Config struct {
	// PrivKey is the transport identity's private key, used to sign
	// records whose key or subkey carries this node's OwnerMarker or whose
	// subkey is its peer ID. Nil takes the transport's key if it exposes
	// one (memnet peers, p2p hosts); otherwise the node cannot store owned
	// records.
	PrivKey crypto.PrivKey
	// BucketSize is Kademlia's k (20): bucket capacity and lookup width.
	BucketSize int
	// Alpha is the number of RPCs a lookup keeps in flight (3).
	Alpha int
	// Replicas is how many of the nearest peers Store writes to (BucketSize).
	Replicas int
	// Quorum is how many replicas must answer with a value before Get
	// stops early (3). Results from all of them are merged.
	Quorum int
	// MaxQueries bounds the RPCs of one lookup (8×BucketSize).
	MaxQueries int
	// RPCTimeout bounds each request (5s).
	RPCTimeout time.Duration
	// MaxRecords bounds stored items, counting each subkey (100000), and
	// MaxBytes their size (128 MiB). When full, an item of the peer that
	// stores the most is evicted to make room for another peer's record.
	MaxRecords, MaxBytes int
	// PeerMaxRecords and PeerMaxBytes are the share of the storage one
	// remote peer may fill (MaxRecords/4, MaxBytes/4); AddrMaxRecords and
	// AddrMaxBytes that of all peers behind one IP address (MaxRecords/2,
	// MaxBytes/2), counted only for public addresses unless
	// LimitPrivateAddrs. Negative means no quota.
	PeerMaxRecords, PeerMaxBytes, AddrMaxRecords, AddrMaxBytes int
	// KeyWriterMaxRecords bounds the subkey items one writer (the peer
	// whose signature they carry, else the one that sent them) may hold
	// under one key (256), and KeyAddrMaxRecords those of all peers behind
	// one IP address (1024; public addresses only unless
	// LimitPrivateAddrs): a key that many peers declare under (an expert
	// grid's prefix, the status key) cannot be crowded by one of them.
	// Negative means no limit.
	KeyWriterMaxRecords, KeyAddrMaxRecords int
	// MaxPeersPerIP (2) and MaxPeersPerSubnet (BucketSize/4, at least 2)
	// bound the routing-table peers of one bucket sharing an IP address or
	// a subnet (/24 for IPv4, /48 for IPv6), so that a Sybil flood from a
	// few machines cannot fill the table; counted only for public
	// addresses unless LimitPrivateAddrs. Negative means no limit.
	MaxPeersPerIP, MaxPeersPerSubnet int
	// LimitPrivateAddrs applies the address quotas and limits to loopback
	// and private addresses too (by default peers on a LAN or one host,
	// as in local swarms, are exempt).
	LimitPrivateAddrs bool
	// MaxValueSize bounds accepted values in bytes (64 KiB, at most MaxValueLen).
	MaxValueSize int
	// MaxTTL rejects records that expire further in the future
	// (DefaultMaxTTL). Store refuses such records; replicas allow
	// MaxClockSkew more for peers whose clocks run ahead.
	MaxTTL time.Duration
	// CacheSize bounds the cache of values seen by Get (10000), and
	// MaxBytes×CacheSize/MaxRecords its size; negative disables caching.
	// Copies other peers push for caching are refused.
	CacheSize int
	// RefreshInterval is how often buckets are refreshed and silent peers
	// pinged (10m); negative disables.
	RefreshInterval time.Duration
	// RepublishInterval is how often records this node stored are stored
	// again to the current nearest peers (15m); negative disables, and
	// then the node does not remember what it stored.
	RepublishInterval time.Duration
	// CleanupInterval is how often expired records are dropped (1m);
	// negative disables (expired records are still never returned).
	CleanupInterval time.Duration
	// ClientMode makes the node query the DHT without serving it: it
	// answers no requests and asks peers not to add it to their tables.
	ClientMode bool
	// Clock is what the node reads the time from: record expiration and
	// freshness, the refresh, republish and cleanup timers, and when
	// routing-table peers were last heard from. Nil means the wall clock.
	// RPCTimeout is a context deadline and stays on the wall clock.
	Clock clock.Clock
	// Metrics, if set, receives the node's Prometheus collector (records,
	// routing table, lookups and their hops, requests, stores refused;
	// see docs/observability.md), unregistered by Close. Nil: no metrics.
	Metrics prometheus.Registerer
}

func (c *Config) setDefaults() error {
	def := func(v *int, d int) {
		if *v == 0 {
			*v = d
		}
	}
	defDur := func(v *time.Duration, d time.Duration) {
		if *v == 0 {
			*v = d
		}
	}
	def(&c.BucketSize, 20)
	def(&c.Alpha, 3)
	def(&c.Replicas, c.BucketSize)
	def(&c.Quorum, 3)
	def(&c.MaxQueries, 8*c.BucketSize)
	def(&c.MaxRecords, 100_000)
	def(&c.MaxBytes, 128<<20)
	def(&c.PeerMaxRecords, max(1, c.MaxRecords/4))
	def(&c.PeerMaxBytes, max(1, c.MaxBytes/4))
	def(&c.AddrMaxRecords, max(1, c.MaxRecords/2))
	def(&c.AddrMaxBytes, max(1, c.MaxBytes/2))
	def(&c.KeyWriterMaxRecords, 256)
	def(&c.KeyAddrMaxRecords, 1024)
	def(&c.MaxPeersPerIP, 2)
	def(&c.MaxPeersPerSubnet, max(2, c.BucketSize/4))
	def(&c.MaxValueSize, 64<<10)
	def(&c.CacheSize, 10_000)
	defDur(&c.RPCTimeout, 5*time.Second)
	defDur(&c.MaxTTL, DefaultMaxTTL)
	defDur(&c.RefreshInterval, 10*time.Minute)
	defDur(&c.RepublishInterval, 15*time.Minute)
	defDur(&c.CleanupInterval, time.Minute)
	c.Clock = clock.Or(c.Clock)
	switch {
	case c.BucketSize < 1 || c.BucketSize > MaxPeers:
		return fmt.Errorf("dht: BucketSize %d not in [1, %d]", c.BucketSize, MaxPeers)
	case c.Alpha < 1 || c.Alpha > 64:
		return fmt.Errorf("dht: Alpha %d not in [1, 64]", c.Alpha)
	case c.Replicas < 1 || c.Replicas > 256:
		return fmt.Errorf("dht: Replicas %d not in [1, 256]", c.Replicas)
	case c.Quorum < 1:
		return fmt.Errorf("dht: Quorum %d < 1", c.Quorum)
	case c.MaxQueries < c.Alpha:
		return fmt.Errorf("dht: MaxQueries %d < Alpha", c.MaxQueries)
	case c.MaxRecords < 1 || c.MaxBytes < 1:
		return fmt.Errorf("dht: MaxRecords %d or MaxBytes %d < 1", c.MaxRecords, c.MaxBytes)
	case c.MaxValueSize < 1 || c.MaxValueSize > MaxValueLen:
		return fmt.Errorf("dht: MaxValueSize %d not in [1, %d]", c.MaxValueSize, MaxValueLen)
	case c.RPCTimeout < 0 || c.MaxTTL < 0:
		return errors.New("dht: negative RPCTimeout or MaxTTL")
	}
	return nil
}

// DefaultMaxTTL is how far ahead a record may expire unless Config.MaxTTL
// says otherwise: many declaration periods of every Skyhive service (MoE
// servers declare every 30 s for 60 s, averaging peers for three rounds),
// while junk stored by a stranger is gone within hours.
const DefaultMaxTTL = 6 * time.Hour

// MaxClockSkew is how much further than MaxTTL ahead a replica accepts a
// record, for writers whose clocks run ahead of its own.
const MaxClockSkew = time.Minute

// storeLimits and cacheLimits are the storage bounds from the config.
func (c *Config) storeLimits() limits {
	pos := func(v int) int { return max(v, 0) }
	return limits{items: c.MaxRecords, bytes: c.MaxBytes,
		peerItems: pos(c.PeerMaxRecords), peerBytes: pos(c.PeerMaxBytes),
		ipItems: pos(c.AddrMaxRecords), ipBytes: pos(c.AddrMaxBytes),
		keyWriterItems: pos(c.KeyWriterMaxRecords), keyIPItems: pos(c.KeyAddrMaxRecords)}
}

func (c *Config) cacheLimits() limits {
	return limits{items: c.CacheSize, bytes: max(1, int(int64(c.MaxBytes)*int64(c.CacheSize)/int64(c.MaxRecords)))}
}

// Stats describes one lookup.
type Stats struct {
	// Hops is the length of the referral chain to the first replica that
	// returned a value (Get) or to the closest peer found (ClosestPeers):
	// 1 for a peer from the node's own routing table, one more for each
	// referral. 0 if no peer answered.
	Hops int
	// Queries is the number of RPCs sent; Failures how many failed.
	Queries, Failures int
	// Crowded reports that a replica's answer was near what one answer
	// carries (half its items or bytes): the key holds many items, maybe
	// a writer's flood, and answers share their room among its writers.
	Crowded bool
}

// Node is one DHT participant. Its methods are safe for concurrent use.
type Node struct {
	t    p2p.Transport
	cfg  Config
	clk  clock.Clock // cfg.Clock
	self peer.ID
	rt   *kb.RoutingTable

	mu     sync.Mutex
	addrs  map[peer.ID][]ma.Multiaddr // addresses of routing-table peers
	groups map[peer.ID]addrGroup      // address groups of routing-table peers
	sigs   verified                   // signatures already checked
	store  *storage
	cache  *storage // nil if disabled
	own    *storage // nil if republishing is disabled
	closed bool
	m      *nodeMetrics // nil without Config.Metrics

	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

// New starts a DHT node on t. Unless in client mode it registers the DHT
// protocol handler. It starts one maintenance goroutine, stopped by Close.
// Call Bootstrap to join a network.
func New(t p2p.Transport, cfg Config) (*Node, error) {
	if err := cfg.setDefaults(); err != nil {
		return nil, err
	}
	self := t.ID()
	if cfg.PrivKey == nil {
		cfg.PrivKey = transportKey(t)
	}
	if cfg.PrivKey != nil {
		id, err := peer.IDFromPrivateKey(cfg.PrivKey)
		if err != nil {
			return nil, fmt.Errorf("dht: private key: %w", err)
		}
		if id != self {
			return nil, fmt.Errorf("dht: private key is %s's, transport is %s", id.ShortString(), self.ShortString())
		}
	}
	rt, err := kb.NewRoutingTable(cfg.BucketSize, kb.ConvertPeerID(self), time.Hour, pstore.NewMetrics(), time.Hour, nil)
	if err != nil {
		return nil, fmt.Errorf("dht: routing table: %w", err)
	}
	n := &Node{
		t:      t,
		cfg:    cfg,
		clk:    cfg.Clock,
		self:   self,
		rt:     rt,
		addrs:  make(map[peer.ID][]ma.Multiaddr),
		groups: make(map[peer.ID]addrGroup),
		store:  newLimitedStorage(cfg.storeLimits()),
	}
	if cfg.CacheSize > 0 {
		// The cache holds merged lookup results, so it follows the merge
		// rule (latest expiration wins) rather than sticky writers.
		n.cache = newLimitedStorage(cfg.cacheLimits())
		n.cache.sticky = false
	}
	if cfg.RepublishInterval > 0 {
		n.own = newStorage(cfg.MaxRecords)
	}
	if cfg.Metrics != nil {
		if n.m, err = newNodeMetrics(n, cfg.Metrics); err != nil {
			rt.Close()
			return nil, err
		}
	}
	n.ctx, n.cancel = context.WithCancel(context.Background())
	if !cfg.ClientMode {
		t.SetHandler(ProtocolID, n.handle)
	}
	n.wg.Add(1)
	go n.maintain()
	return n, nil
}

// ID is the node's peer ID.
func (n *Node) ID() peer.ID { return n.self }

// Peers lists the routing table.
func (n *Node) Peers() []peer.ID { return n.rt.ListPeers() }

// Records is the number of records the node stores for the network (its
// cache and its own republished records not counted).
func (n *Node) Records() int {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.store.Len()
}

// Close stops the node's goroutines and makes it refuse requests. The
// transport stays open; it belongs to the caller.
func (n *Node) Close() error {
	n.mu.Lock()
	if n.closed {
		n.mu.Unlock()
		return nil
	}
	n.closed = true
	n.mu.Unlock()
	if n.m != nil {
		n.m.reg.Unregister(n.m)
	}
	n.cancel()
	n.wg.Wait()
	return n.rt.Close()
}

func (n *Node) isClosed() bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.closed
}

// Bootstrap joins the network through the given peers: it pings them, then
// refreshes the routing table with a lookup of its own ID and of a random
// key in each bucket. It fails only if no seed answered.
func (n *Node) Bootstrap(ctx context.Context, seeds []peer.AddrInfo) error {
	var errs []error
	ok := 0
	for _, s := range seeds {
		if s.ID == n.self {
			continue
		}
		if err := n.Ping(ctx, s); err != nil {
			errs = append(errs, err)
			continue
		}
		ok++
	}
	if ok == 0 && len(errs) > 0 {
		return fmt.Errorf("dht: bootstrap: no seed answered: %w", errors.Join(errs...))
	}
	return n.Refresh(ctx)
}

// Store writes value under (key, subkey) with the given expiration to the
// Replicas nearest peers (and to this node if it is one of them) and
// returns how many accepted it. An empty subkey stores a plain value.
// Owner-marked records are signed with Config.PrivKey. Unless
// republishing is disabled, the node stores the record again every
// RepublishInterval until it expires.
func (n *Node) Store(ctx context.Context, key, subkey string, value []byte, expiration time.Time) (int, error) {
	now := n.clk.Now()
	e := &entry{Key: key, Subkey: subkey, Value: bytes.Clone(value), Expiration: expiration.UnixNano()}
	if e.Value == nil {
		e.Value = []byte{}
	}
	if err := n.check(e, now, 0); err != nil {
		return 0, err
	}
	if err := sign(e, n.self, n.cfg.PrivKey); err != nil {
		return 0, err
	}
	if n.own != nil {
		n.mu.Lock()
		_ = n.own.put(e, now.UnixNano()) // a fresher own record may already be there
		n.mu.Unlock()
	}
	return n.storeEntries(ctx, key, []*entry{e})
}

// check validates a record's key, sizes and expiration, allowing skew
// beyond MaxTTL.
func (n *Node) check(e *entry, now time.Time, skew time.Duration) error {
	switch {
	case e.Key == "":
		return errors.New("dht: empty key")
	case len(e.Key) > MaxKeyLen || len(e.Subkey) > MaxKeyLen:
		return fmt.Errorf("%w: key or subkey longer than %d bytes", ErrTooLarge, MaxKeyLen)
	case len(e.Value) > n.cfg.MaxValueSize:
		return fmt.Errorf("%w: value of %d bytes, max %d", ErrTooLarge, len(e.Value), n.cfg.MaxValueSize)
	case e.Expiration <= now.UnixNano():
		return ErrExpired
	case e.Expiration > now.Add(n.cfg.MaxTTL+skew).UnixNano():
		return fmt.Errorf("%w: expiration %v ahead, more than the maximum %v", ErrTTL,
			time.Unix(0, e.Expiration).Sub(now).Round(time.Second), n.cfg.MaxTTL)
	}
	return nil
}

// storeEntries sends entries, all under key, to the nearest peers.
func (n *Node) storeEntries(ctx context.Context, key string, es []*entry) (int, error) {
	target := kb.ConvertKey(key)
	replicas, err := n.closest(ctx, target)
	if err != nil && !errors.Is(err, ErrNoPeers) {
		return 0, err
	}
	accepted := 0
	if !n.cfg.ClientMode {
		selfDist := kb.Xor(target, kb.ConvertPeerID(n.self))
		if len(replicas) < n.cfg.Replicas || bytes.Compare(selfDist, replicas[len(replicas)-1].dist) < 0 {
			if len(replicas) == n.cfg.Replicas {
				replicas = replicas[:len(replicas)-1]
			}
			if n.putLocal(es, false, "", "") > 0 {
				accepted++
			}
		}
	}
	if len(replicas) == 0 {
		if accepted > 0 {
			return accepted, nil
		}
		return 0, fmt.Errorf("dht: store %q: %w", key, ErrNoPeers)
	}
	req, err := n.request(&request{Type: msgStore, Entries: es})
	if err != nil {
		return 0, err
	}
	var (
		mu        sync.Mutex
		wg        sync.WaitGroup
		responded int
	)
	for _, c := range replicas {
		info := c.info
		wg.Add(1)
		go func() {
			defer wg.Done()
			resp, err := n.call(ctx, info, req, msgStore)
			if err != nil {
				return
			}
			mu.Lock()
			defer mu.Unlock()
			responded++
			if slices.Contains(resp.Accepted, true) {
				accepted++
			}
		}()
	}
	wg.Wait()
	switch {
	case accepted > 0:
		return accepted, nil
	case responded > 0:
		return 0, fmt.Errorf("dht: store %q: %w", key, ErrRejected)
	case ctx.Err() != nil:
		return 0, fmt.Errorf("dht: store %q: %w", key, ctx.Err())
	}
	return 0, fmt.Errorf("dht: store %q: no replica answered: %w", key, ErrNoPeers)
}

// putLocal stores copies of entries, sent by peer from (at address group
// ip), in the node's storage (or cache) and returns how many were accepted.
// from is "" for the node's own records.
func (n *Node) putLocal(es []*entry, cached bool, from, ip string) int {
	now := n.clk.Now().UnixNano()
	n.mu.Lock()
	defer n.mu.Unlock()
	s := n.store
	if cached {
		s = n.cache
	}
	if s == nil {
		return 0
	}
	ok := 0
	for _, e := range es {
		cp := *e
		cp.from, cp.ip = from, ip
		if s.put(&cp, now) == nil {
			ok++
		}
	}
	return ok
}

// putRemote stores a copy of e, sent by peer from (at address group ip),
// in the node's storage, or says why not.
func (n *Node) putRemote(e *entry, from, ip string) error {
	now := n.clk.Now().UnixNano()
	cp := *e
	cp.from, cp.ip = from, ip
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.store.put(&cp, now)
}

// localItems returns the freshest items this node holds for key, from
// storage and cache.
func (n *Node) localItems(key string) []*entry {
	now := n.clk.Now().UnixNano()
	n.mu.Lock()
	defer n.mu.Unlock()
	es := n.store.get(key, now)
	if n.cache != nil {
		if c := n.cache.get(key, now); len(c) > 0 {
			es = merge(now, es, c)
		}
	}
	return es
}

// Get looks key up and returns its freshest value per subkey (the plain
// value under subkey ""), merging the answers of up to Quorum replicas and
// this node's own storage. It returns ErrNotFound if no live record exists.
func (n *Node) Get(ctx context.Context, key string) (map[string]Item, error) {
	items, _, err := n.GetStats(ctx, key)
	return items, err
}

// GetStats is Get that also describes the lookup.
func (n *Node) GetStats(ctx context.Context, key string) (map[string]Item, Stats, error) {
	if key == "" || len(key) > MaxKeyLen {
		return nil, Stats{}, fmt.Errorf("dht: bad key length %d", len(key))
	}
	now := n.clk.Now()
	local := n.localItems(key)
	req, err := n.request(&request{Type: msgFindValue, Key: key})
	if err != nil {
		return nil, Stats{}, err
	}
	var (
		found    [][]*entry
		firstHop int
		crowded  bool
	)
	l, err := n.iterate(ctx, kb.ConvertKey(key), req, msgFindValue, func(c *candidate, resp *response) bool {
		crowded = crowded || nearlyFull(resp.Items)
		var valid []*entry
		for _, e := range resp.Items {
			e.Key = key
			if n.check(e, now, MaxClockSkew) == nil && validateWith(e, &n.sigs) == nil {
				valid = append(valid, e)
			}
		}
		if len(valid) == 0 {
			return false
		}
		found = append(found, valid)
		if firstHop == 0 {
			firstHop = c.hop
		}
		return len(found) >= n.cfg.Quorum
	})
	st := l.stats()
	st.Crowded = crowded
	if crowded && n.m != nil {
		n.m.crowdedReads.Inc()
	}
	if firstHop > 0 {
		st.Hops = firstHop
	}
	if n.m != nil && firstHop > 0 {
		n.m.hop(msgFindValue, firstHop)
	}
	merged := merge(now.UnixNano(), append(found, local)...)
	if len(merged) == 0 {
		if err != nil && !errors.Is(err, ErrNoPeers) {
			return nil, st, err
		}
		return nil, st, fmt.Errorf("dht: get %q: %w", key, ErrNotFound)
	}
	if len(found) > 0 && n.cache != nil {
		n.putLocal(merged, true, "", "")
	}
	out := make(map[string]Item, len(merged))
	for _, e := range merged {
		out[e.Subkey] = Item{Value: e.Value, Expiration: time.Unix(0, e.Expiration)}
	}
	return out, st, nil
}

// itemBudget bounds the items of one FIND_VALUE answer so that it fits a
// message along with the peers.
const itemBudget = MaxMessageSize - 256<<10

// nearlyFull reports whether an answer holds half the items or bytes one
// answer may carry.
func nearlyFull(es []*entry) bool {
	if len(es) >= MaxItems/2 {
		return true
	}
	size := 0
	for _, e := range es {
		size += answerBytes(e)
	}
	return size >= itemBudget/2
}

// answerBytes is what an item takes of an answer's itemBudget.
func answerBytes(e *entry) int { return len(e.Subkey) + len(e.Value) + len(e.Signature) + 16 }

// handle answers one DHT request.
func (n *Node) handle(ctx context.Context, from peer.ID, data []byte) ([]byte, error) {
	if n.isClosed() {
		return nil, ErrClosed
	}
	req, err := decodeRequest(data)
	if err != nil {
		return nil, err
	}
	observed := n.observedAddrs(from)
	if !req.Client {
		n.addPeerSeen(peer.AddrInfo{ID: from, Addrs: req.Addrs}, false, observed)
	}
	resp := &response{Type: req.Type}
	if n.m != nil {
		n.m.request(req.Type)
	}
	switch req.Type {
	case msgPing:
	case msgFindNode:
		resp.Peers = n.nearestInfos(req.Target, from)
	case msgFindValue:
		if req.Key == "" {
			return nil, errors.New("dht: empty key")
		}
		var cut bool
		resp.Items, cut = fitItems(n.localItems(req.Key))
		if cut && n.m != nil {
			n.m.answersCut.Inc()
		}
		resp.Peers = n.nearestInfos(kb.ConvertKey(req.Key), from)
	case msgStore:
		now := n.clk.Now()
		ip := ""
		// Quotas per address count only what the transport observes:
		// announced addresses could name someone else's.
		if g := n.group(observed, nil); g.limited {
			ip = g.ip
		}
		resp.Accepted = make([]bool, len(req.Entries))
		for i, e := range req.Entries {
			err := n.check(e, now, MaxClockSkew)
			if err == nil {
				err = validateWith(e, &n.sigs)
			}
			// Only records for keys this node is a replica of are
			// stored. Copies pushed for caching are refused: a reader
			// stops at the first answers it gets, so a pushed copy
			// could hide a key's dictionary or a declaration's owner;
			// the cache holds only what the node's own lookups found.
			if err == nil && (req.Cache || !n.amongClosest(e.Key)) {
				err = errNotReplica
			}
			if err == nil {
				err = n.putRemote(e, string(from), ip)
			}
			resp.Accepted[i] = err == nil
			if n.m != nil {
				n.m.stored(err)
			}
		}
	}
	return encodeResponse(resp)
}

// fitItems chooses the items of one answer, sharing it fairly among the
// key's writers: in rounds, each writer's next freshest item, writers with
// fewer items first (ties by name), until the answer is full. A writer's
// volume or far expirations buy it no place before another writer's
// first item. cut reports whether items were left out.
func fitItems(es []*entry) (fit []*entry, cut bool) {
	byWriter := map[string][]*entry{}
	for _, e := range es {
		w := writerOf(e)
		byWriter[w] = append(byWriter[w], e)
	}
	writers := make([]string, 0, len(byWriter))
	for w, items := range byWriter {
		slices.SortFunc(items, func(a, b *entry) int { return -cmp.Compare(a.Expiration, b.Expiration) })
		writers = append(writers, w)
	}
	slices.SortFunc(writers, func(a, b string) int {
		return cmp.Or(cmp.Compare(len(byWriter[a]), len(byWriter[b])), cmp.Compare(a, b))
	})
	size := 0
	for round := 0; len(writers) > 0; round++ {
		left := writers[:0]
		for _, w := range writers {
			items := byWriter[w]
			e := items[round]
			size += answerBytes(e)
			if size > itemBudget || len(fit) == MaxItems {
				return fit, true
			}
			fit = append(fit, e)
			if round+1 < len(items) {
				left = append(left, w)
			}
		}
		writers = left
	}
	return fit, false
}
