package p2p

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	relayv2 "github.com/libp2p/go-libp2p/p2p/protocol/circuitv2/relay"
	"io"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/libp2p/go-libp2p"
	"github.com/libp2p/go-libp2p/core/crypto"
	"github.com/libp2p/go-libp2p/core/event"
	"github.com/libp2p/go-libp2p/core/host"
	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/core/peerstore"
	"github.com/libp2p/go-libp2p/core/protocol"
	"github.com/libp2p/go-libp2p/p2p/host/eventbus"
	rcmgr "github.com/libp2p/go-libp2p/p2p/host/resource-manager"
	"github.com/libp2p/go-libp2p/p2p/muxer/yamux"
	"github.com/libp2p/go-libp2p/p2p/net/connmgr"
	"github.com/libp2p/go-libp2p/p2p/security/noise"
	libp2ptls "github.com/libp2p/go-libp2p/p2p/security/tls"
	libp2pquic "github.com/libp2p/go-libp2p/p2p/transport/quic"
	"github.com/libp2p/go-libp2p/p2p/transport/tcp"
	ma "github.com/multiformats/go-multiaddr"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/skyhive/skyhive/p2p/admission"
	"github.com/skyhive/skyhive/p2p/blocklist"
)

// Security selects the handshake used on TCP connections. QUIC always uses
// TLS 1.3, which is part of the protocol.
type Security int

const (
	// SecurityTLS offers TLS 1.3 only (the default).
	SecurityTLS Security = iota
	// SecurityNoise offers Noise only.
	SecurityNoise
	// SecurityTLSNoise offers TLS, then Noise, for peers that only speak Noise.
	SecurityTLSNoise
)

// Reachability overrides what AutoNAT would detect.
type Reachability int

const (
	// ReachabilityAuto lets AutoNAT decide.
	ReachabilityAuto Reachability = iota
	// ReachabilityPublic declares the host publicly reachable.
	ReachabilityPublic
	// ReachabilityPrivate declares the host behind a NAT, which makes a relay
	// client with static relays reserve slots on them right away.
	ReachabilityPrivate
)

// Defaults of Config.
const (
	DefaultMaxMessageBytes = 16 << 20
	DefaultMaxStreamBytes  = 1 << 30
	DefaultIdleTimeout     = 30 * time.Second
	DefaultHandlerTimeout  = 5 * time.Minute
	DefaultMinRequestRate  = 64 << 10
	DefaultChunkBytes      = 256 << 10
	MaxChunkBytes          = 4 << 20
	maxErrorBytes          = 4 << 10
)

// Config configures a Host. The zero value is a usable ephemeral host that
// listens on all interfaces over TCP and QUIC with TLS and contacts nobody.
type Config struct {
	// IdentityFile holds the host's private key. If the file does not exist
	// an Ed25519 key is created there with mode 0600. Empty means an
	// ephemeral key, a new peer ID on every start.
	IdentityFile string
	// ListenAddrs are multiaddrs to listen on; empty means
	// /ip4/0.0.0.0/tcp/0 and /ip4/0.0.0.0/udp/0/quic-v1.
	ListenAddrs []string
	// AnnounceAddrs, if set, replace the listen addresses in what the host
	// tells other peers (for example a public address behind port forwarding).
	AnnounceAddrs []string
	// Security is the TCP handshake (default TLS).
	Security Security

	// RelayClient lets the host dial and accept connections through circuit
	// relay v2 relays.
	RelayClient bool
	// RelayService makes the host act as a circuit relay v2 for others when
	// it is publicly reachable.
	RelayService bool
	// StaticRelays are relays the host reserves slots on when it is not
	// publicly reachable; they imply RelayClient.
	StaticRelays []peer.AddrInfo
	// HolePunching enables DCUtR hole punching over relayed connections.
	HolePunching bool
	// AutoNAT runs the AutoNAT service for others and AutoNAT v2 to learn
	// the host's own reachability.
	AutoNAT bool
	// Reachability overrides AutoNAT's verdict.
	Reachability Reachability

	// ConnLow and ConnHigh are the connection manager's watermarks: above
	// high it trims down to low, sparing connections younger than
	// ConnGrace. Defaults: 160, 192, 1 minute.
	ConnLow, ConnHigh int
	ConnGrace         time.Duration

	// MaxMessageBytes bounds a Call's request and response (default 16 MiB).
	MaxMessageBytes int
	// MaxStreamBytes bounds one direction of a streamed call (default 1 GiB).
	MaxStreamBytes int64
	// ChunkBytes is the frame size of streamed calls (default 256 KiB, at
	// most MaxChunkBytes).
	ChunkBytes int
	// IdleTimeout bounds every wait of a handler for its peer: for the next
	// bytes of a request, or for room to write a response (default 30 s).
	IdleTimeout time.Duration
	// HandlerTimeout bounds a handler's run; its ctx ends then (default 5 min).
	HandlerTimeout time.Duration
	// MinRequestRate is the slowest a call's request may arrive, in bytes
	// per second after the first IdleTimeout (default 64 KiB/s), whatever
	// size it announces: by time t after it began, at least
	// (t − IdleTimeout)·MinRequestRate bytes must have arrived, or the
	// stream is cut.
	MinRequestRate int
	// RequestMemory bounds the bytes of the calls' requests this host reads
	// or handles at once, across protocols (0: no bound beyond
	// MaxMessageBytes per call); one peer may hold at most a quarter of
	// it. A request that does not fit is refused as busy from its length
	// prefix, before its bytes are read.
	RequestMemory int64
	// MaxPendingPerPeer and MaxPendingPerAddr bound the call requests of
	// one protocol this host reads at once from one peer and from one
	// address (an IPv4 address or IPv6 /64): a further stream is told the
	// host is busy at once, so that slow requests from one source cannot
	// hold all of libp2p's streams of the protocol (defaults
	// DefaultMaxPendingPerPeer, DefaultMaxPendingPerAddr).
	MaxPendingPerPeer, MaxPendingPerAddr int

	// MemoryBudget sizes libp2p's resource manager, which bounds the
	// connections and streams (and their buffers) in total, per peer and per
	// protocol: the limits scale with it as libp2p's defaults do. Zero means
	// an eighth of the machine's memory (libp2p's own choice).
	MemoryBudget int64

	// Admission, when set, closes the swarm to peers that cannot prove
	// they belong to it (see package admission); nil is an open swarm.
	Admission *admission.Config

	// Logger receives handler panics and other events; nil discards them.
	Logger *slog.Logger

	// Metrics, if set, receives the host's Prometheus collector
	// (connections, streams, and per protocol the RPC bytes, durations and
	// errors; see docs/observability.md), unregistered by Close. Nil: no
	// metrics, and no cost.
	Metrics prometheus.Registerer
}

func (c Config) withDefaults() Config {
	if c.MaxMessageBytes <= 0 {
		c.MaxMessageBytes = DefaultMaxMessageBytes
	}
	if c.MinRequestRate <= 0 {
		c.MinRequestRate = DefaultMinRequestRate
	}
	if c.MaxPendingPerPeer <= 0 {
		c.MaxPendingPerPeer = DefaultMaxPendingPerPeer
	}
	if c.MaxPendingPerAddr <= 0 {
		c.MaxPendingPerAddr = DefaultMaxPendingPerAddr
	}
	if c.MaxStreamBytes <= 0 {
		c.MaxStreamBytes = DefaultMaxStreamBytes
	}
	if c.ChunkBytes <= 0 {
		c.ChunkBytes = DefaultChunkBytes
	}
	c.ChunkBytes = min(c.ChunkBytes, MaxChunkBytes)
	if c.IdleTimeout <= 0 {
		c.IdleTimeout = DefaultIdleTimeout
	}
	if c.HandlerTimeout <= 0 {
		c.HandlerTimeout = DefaultHandlerTimeout
	}
	if c.ConnHigh <= 0 {
		c.ConnHigh = 192
	}
	if c.ConnLow <= 0 || c.ConnLow > c.ConnHigh {
		c.ConnLow = c.ConnHigh * 5 / 6
	}
	if c.ConnGrace <= 0 {
		c.ConnGrace = time.Minute
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	return c
}

// Host is a libp2p host with Skyhive's RPC on top. It implements Transport.
// All methods are safe for concurrent use.
type Host struct {
	h   host.Host
	cfg Config
	log *slog.Logger
	// logs rate-limits the warnings remote peers provoke.
	logs logLimit

	ctx    context.Context // ends when the host closes; parent of handler ctxs
	cancel context.CancelFunc

	// adm runs the admission protocol (nil: an open swarm); blocks are
	// the blocked peers (see BlockList).
	adm    *admission.Service
	blocks *blocklist.List

	mu       sync.Mutex
	closed   bool
	seen     Reachability       // AutoNAT's last verdict (reachSub drained)
	reachSub event.Subscription // AutoNAT's verdicts
	handlers sync.WaitGroup     // running stream handlers
	serving  sync.WaitGroup     // running call handlers (SetHandler), a subset of handlers
	slow     map[peer.ID]int    // calls cut for arriving too slowly, per peer (noteSlow)
	reqs     requestBytes       // requests being read or handled (RequestMemory)
	pending  pendingReads       // requests being read, per protocol (MaxPendingPer…)
	// answered is when a call was last answered with a large response
	// (UnixNano), for Close's linger.
	answered atomic.Int64
	circuits []ma.Multiaddr // relayed addresses of granted reservations
	renewing sync.WaitGroup // the reservation renewal loop

	m *hostMetrics // nil without Config.Metrics

	// calls bounds the calls in flight per peer and protocol.
	calls streamSlots
}

var _ Transport = (*Host)(nil)

// New starts a host as configured. ctx bounds only the start-up; the host
// runs until Close. With StaticRelays, New reserves a slot on them and fails
// with ErrRelay if none grants one. With Admission it runs the admission
// protocol (package admission) and consults it before it serves or opens a
// stream; the block list (package blocklist) is always wired in.
func New(ctx context.Context, cfg Config) (*Host, error) {
	cfg = cfg.withDefaults()
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("p2p: new host: %w", err)
	}
	key, err := identityKey(cfg.IdentityFile)
	if err != nil {
		return nil, err
	}
	self, err := peer.IDFromPrivateKey(key)
	if err != nil {
		return nil, fmt.Errorf("p2p: peer ID: %w", err)
	}
	h := &Host{cfg: cfg, log: cfg.Logger}
	h.blocks = blocklist.New(self, blocklist.Options{Warn: h.warnPeer})
	acl := &admission.RelayACL{}
	lh, err := startLibp2p(cfg, key, acl, h.blocks)
	if err != nil {
		return nil, err
	}
	sub, err := lh.EventBus().Subscribe(new(event.EvtLocalReachabilityChanged), eventbus.BufSize(16))
	if err != nil {
		lh.Close()
		return nil, fmt.Errorf("p2p: subscribe to reachability: %w", err)
	}
	h.h, h.reachSub = lh, sub
	h.ctx, h.cancel = context.WithCancel(context.Background())
	h.blocks.Attach(lh.Network())
	if cfg.Metrics != nil {
		if h.m, err = newHostMetrics(h, cfg.Metrics); err != nil {
			h.Close()
			return nil, err
		}
	}
	if cfg.Admission != nil {
		if h.adm, err = admission.New(lh, *cfg.Admission, admission.Options{Logger: h.log, Warn: h.warnPeer}); err != nil {
			h.Close()
			return nil, fmt.Errorf("p2p: %w", err)
		}
		acl.Use(h.adm)
	}
	if err := h.checkRelays(ctx); err != nil {
		h.Close()
		return nil, err
	}
	return h, nil
}

// startLibp2p starts the libp2p host with Skyhive's options, its
// connection manager and resource manager, and the block list wired in.
func startLibp2p(cfg Config, key crypto.PrivKey, acl *admission.RelayACL, blocks *blocklist.List) (host.Host, error) {
	cm, err := connmgr.NewConnManager(cfg.ConnLow, cfg.ConnHigh, connmgr.WithGracePeriod(cfg.ConnGrace))
	if err != nil {
		return nil, fmt.Errorf("p2p: connection manager: %w", err)
	}
	opts, err := libp2pOptions(cfg, key, acl, blocks)
	if err != nil {
		cm.Close()
		return nil, err
	}
	rm, err := resourceManager(cfg.MemoryBudget)
	if err != nil {
		cm.Close()
		return nil, err
	}
	rm = blocks.ResourceManager(rm)
	lh, err := libp2p.New(append(opts, libp2p.ConnectionManager(cm), libp2p.ResourceManager(rm), libp2p.ConnectionGater(blocks.Gater()))...)
	if err != nil {
		cm.Close()
		rm.Close()
		return nil, fmt.Errorf("p2p: start libp2p: %w", err)
	}
	return lh, nil
}

// identityKey loads the identity file, or makes an ephemeral key without
// one.
func identityKey(file string) (crypto.PrivKey, error) {
	if file != "" {
		return LoadOrCreateIdentity(file)
	}
	key, _, err := crypto.GenerateEd25519Key(rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("p2p: generate identity: %w", err)
	}
	return key, nil
}

func libp2pOptions(cfg Config, key crypto.PrivKey, acl *admission.RelayACL, blocks *blocklist.List) ([]libp2p.Option, error) {
	listen := cfg.ListenAddrs
	if len(listen) == 0 {
		listen = []string{"/ip4/0.0.0.0/tcp/0", "/ip4/0.0.0.0/udp/0/quic-v1"}
	}
	opts := []libp2p.Option{
		libp2p.Identity(key),
		libp2p.ListenAddrStrings(listen...),
		// TCP dials leave from ephemeral ports. With reuseport they leave
		// from the listening port, so two peers that dial each other at
		// once (common: both learn of each other from the same DHT answer)
		// meet as one TCP connection on which both start the security
		// handshake as its client; both dials fail and libp2p then refuses
		// the address for its 5 s dial backoff (TestSimultaneousDials).
		// Hole punching goes over QUIC, whose dials share the listening
		// UDP socket and tell connections apart by their IDs.
		libp2p.Transport(tcp.NewTCPTransport, tcp.DisableReuseport()),
		libp2p.Transport(libp2pquic.NewTransport),
		libp2p.Muxer(yamux.ID, yamux.DefaultTransport),
		libp2p.DisableMetrics(),
		libp2p.UserAgent("skyhive"),
	}
	tlsSec := libp2p.Security(libp2ptls.ID, blocklist.Stalling(libp2ptls.New, blocks))
	noiseSec := libp2p.Security(noise.ID, blocklist.Stalling(noise.New, blocks))
	switch cfg.Security {
	case SecurityTLS:
		opts = append(opts, tlsSec)
	case SecurityNoise:
		opts = append(opts, noiseSec)
	case SecurityTLSNoise:
		opts = append(opts, tlsSec, noiseSec)
	default:
		return nil, fmt.Errorf("p2p: unknown security %d", cfg.Security)
	}
	if len(cfg.AnnounceAddrs) > 0 {
		announce := make([]ma.Multiaddr, 0, len(cfg.AnnounceAddrs))
		for _, s := range cfg.AnnounceAddrs {
			a, err := ma.NewMultiaddr(s)
			if err != nil {
				return nil, fmt.Errorf("p2p: announce address %q: %w", s, err)
			}
			announce = append(announce, a)
		}
		opts = append(opts, libp2p.AddrsFactory(func([]ma.Multiaddr) []ma.Multiaddr { return announce }))
	}
	if cfg.RelayClient || len(cfg.StaticRelays) > 0 {
		opts = append(opts, libp2p.EnableRelay())
	} else {
		opts = append(opts, libp2p.DisableRelay())
	}
	if len(cfg.StaticRelays) > 0 {
		opts = append(opts, libp2p.EnableAutoRelayWithStaticRelays(cfg.StaticRelays))
	}
	if cfg.RelayService {
		ropts := []relayv2.Option{relayv2.WithResources(RelayResources())}
		if cfg.Admission != nil {
			ropts = append(ropts, relayv2.WithACL(acl))
		}
		opts = append(opts, libp2p.EnableRelayService(ropts...))
	}
	if cfg.HolePunching {
		opts = append(opts, libp2p.EnableHolePunching())
	}
	if cfg.AutoNAT {
		opts = append(opts, libp2p.EnableNATService(), libp2p.EnableAutoNATv2())
	}
	switch cfg.Reachability {
	case ReachabilityPublic:
		opts = append(opts, libp2p.ForceReachabilityPublic())
	case ReachabilityPrivate:
		opts = append(opts, libp2p.ForceReachabilityPrivate())
	}
	return opts, nil
}

// resourceManager bounds libp2p's connections and streams; the limits
// scale with the memory budget (libp2p's default limits, scaled).
func resourceManager(budget int64) (network.ResourceManager, error) {
	limits := rcmgr.DefaultLimits
	libp2p.SetDefaultServiceLimits(&limits)
	var lc rcmgr.ConcreteLimitConfig
	if budget > 0 {
		lc = limits.Scale(budget, fileLimit()/2)
	} else {
		lc = limits.AutoScale()
	}
	rm, err := rcmgr.NewResourceManager(rcmgr.NewFixedLimiter(lc))
	if err != nil {
		return nil, fmt.Errorf("p2p: resource manager: %w", err)
	}
	return rm, nil
}

// ID is this peer's identity.
func (h *Host) ID() peer.ID { return h.h.ID() }

// AddrInfo is this peer's identity with the addresses it announces.
func (h *Host) AddrInfo() peer.AddrInfo {
	addrs := h.h.Addrs()
	h.mu.Lock()
	for _, c := range h.circuits {
		if !slices.ContainsFunc(addrs, c.Equal) {
			addrs = append(addrs, c)
		}
	}
	h.mu.Unlock()
	return peer.AddrInfo{ID: h.h.ID(), Addrs: addrs}
}

// LibP2P returns the underlying libp2p host, for protocols that need more
// than request/response (its lifetime is the Host's).
func (h *Host) LibP2P() host.Host { return h.h }

// Connect makes sure there is a connection to the peer.
func (h *Host) Connect(ctx context.Context, to peer.AddrInfo) error {
	if err := h.h.Connect(ctx, to); err != nil {
		return fmt.Errorf("p2p: connect %s: %w", to.ID.ShortString(), err)
	}
	return nil
}

// Admission is the host's admission protocol, nil in an open swarm (on
// which Admitted reports true for everyone).
func (h *Host) Admission() *admission.Service { return h.adm }

// BlockList is the host's list of blocked peers: protocols block a peer
// that sent what no honest peer sends (see blocklist.List.Block).
func (h *Host) BlockList() *blocklist.List { return h.blocks }

// gate decides whether a stream from p may be served: p is not blocked,
// and it is admitted or its handshake admits it within the timeout.
func (h *Host) gate(p peer.ID) bool {
	if h.blocks.Blocked(p) {
		return false
	}
	return h.adm == nil || h.adm.Allow(p)
}

// refusal says why a stream of p is refused; a blocked peer is told once.
func (h *Host) refusal(p peer.ID) string {
	if h.blocks.Refuse(p) {
		return blocklist.Refusal
	}
	return admission.Refusal
}

// NumConns returns the number of open connections to the peer.
func (h *Host) NumConns(p peer.ID) int { return len(h.h.Network().ConnsToPeer(p)) }

// Close stops the host: listeners, connections, running handlers (whose
// ctx ends and whose streams are reset). It waits for handlers to return.
// Calls already being served get up to closeGrace to finish and send
// their responses first, so that a peer leaving right after a collective
// still delivers the answers it owes (new requests are refused at once).
func (h *Host) Close() error {
	h.mu.Lock()
	if h.closed {
		h.mu.Unlock()
		return nil
	}
	h.closed = true
	h.mu.Unlock()
	answered := make(chan struct{})
	go func() {
		h.serving.Wait()
		close(answered)
	}()
	grace := time.NewTimer(closeGrace)
	select {
	case <-answered:
	case <-grace.C:
	}
	grace.Stop()
	// A large answer written just now may still be on its way; closing the
	// connection under it while the caller's acknowledgements arrive would
	// reset it.
	if wait := time.Until(time.Unix(0, h.answered.Load()).Add(closeLinger)); wait > 0 {
		time.Sleep(min(wait, closeLinger))
	}
	if h.m != nil {
		h.m.reg.Unregister(h.m)
	}
	h.cancel()
	h.renewing.Wait()
	h.reachSub.Close()
	err := h.h.Close()
	if h.adm != nil {
		h.adm.Close()
	}
	h.handlers.Wait()
	<-answered
	if err != nil {
		return fmt.Errorf("p2p: close: %w", err)
	}
	return nil
}

// closeGrace bounds how long Close lets running call handlers finish, and
// closeLinger is how long after answering a call with at least
// lingerBytes it keeps the connections open.
const (
	closeGrace  = 2 * time.Second
	closeLinger = 500 * time.Millisecond
	lingerBytes = 64 << 10
)

// Peers whose calls are cut for arriving below MinRequestRate slowStrikes
// times are blocked for slowBlockFor: their streams are then refused at
// once instead of holding a handler for an idle timeout each. slowTracked
// bounds the peers counted (the table restarts when full).
const (
	slowStrikes  = 3
	slowBlockFor = 10 * time.Minute
	slowTracked  = 4096
)

// noteSlow counts a call of p cut for arriving too slowly and blocks p at
// its slowStrikes-th.
func (h *Host) noteSlow(p peer.ID, proto protocol.ID) {
	h.mu.Lock()
	if h.slow == nil || len(h.slow) >= slowTracked {
		h.slow = map[peer.ID]int{}
	}
	h.slow[p]++
	strikes := h.slow[p]
	if strikes >= slowStrikes {
		delete(h.slow, p)
	}
	h.mu.Unlock()
	if strikes >= slowStrikes {
		h.warnPeer("p2p: blocking a peer whose requests arrive too slowly", "peer", p, "proto", proto, "cut", strikes, "for", slowBlockFor)
		h.blocks.Block(p, slowBlockFor)
	}
}

// isClosing reports whether Close has begun.
func (h *Host) isClosing() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.closed
}

// track registers a running handler; it reports false once the host closes.
func (h *Host) track() bool { return h.trackAs(false) }

// trackAs is track; call marks a call handler, which Close lets finish
// first.
func (h *Host) trackAs(call bool) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closed {
		return false
	}
	h.handlers.Add(1)
	if call {
		h.serving.Add(1)
	}
	return true
}

// openStream opens a stream to the peer, reusing a connection if one
// exists. The stream gets ctx's deadline and is reset if ctx ends before
// release is called.
func (h *Host) openStream(ctx context.Context, to peer.AddrInfo, proto protocol.ID) (s network.Stream, release func(), err error) {
	if to.ID == "" {
		return nil, nil, errors.New("p2p: call without a peer ID")
	}
	if to.ID == h.h.ID() {
		return nil, nil, errors.New("p2p: call to self")
	}
	if len(to.Addrs) > 0 {
		h.h.Peerstore().AddAddrs(to.ID, to.Addrs, peerstore.TempAddrTTL)
	}
	if h.adm != nil {
		if err := h.adm.Admit(ctx, to.ID); err != nil {
			return nil, nil, ctxErr(ctx, err)
		}
	}
	free, err := h.calls.acquire(ctx, to.ID, proto)
	if err != nil {
		return nil, nil, fmt.Errorf("p2p: waiting for a free stream to %s: %w", to.ID.ShortString(), err)
	}
	// Relayed (limited) connections are allowed: behind NATs they may be
	// all there is, and the relay enforces its own data limits.
	s, err = h.h.NewStream(network.WithAllowLimitedConn(ctx, "skyhive-rpc"), to.ID, proto)
	if err != nil {
		free()
		return nil, nil, ctxErr(ctx, fmt.Errorf("p2p: open %s to %s: %w", proto, to.ID.ShortString(), err))
	}
	if dl, ok := ctx.Deadline(); ok {
		if err := s.SetDeadline(dl); err != nil {
			s.Reset()
			free()
			return nil, nil, fmt.Errorf("p2p: set deadline: %w", err)
		}
	}
	stop := context.AfterFunc(ctx, func() { s.Reset() })
	return s, func() { stop(); free() }, nil
}

// ctxErr prefers ctx's error: once ctx has ended, whatever broke the stream
// (a reset, a deadline) is a consequence of it.
func ctxErr(ctx context.Context, err error) error {
	if err == nil {
		return nil
	}
	if cerr := ctx.Err(); cerr != nil && !errors.Is(err, cerr) {
		return fmt.Errorf("%w (%v)", cerr, err)
	}
	if isTimeout(err) && !errors.Is(err, context.DeadlineExceeded) {
		return fmt.Errorf("%w (%v)", context.DeadlineExceeded, err)
	}
	return err
}

func isTimeout(err error) bool {
	var t interface{ Timeout() bool }
	return errors.As(err, &t) && t.Timeout()
}

// Limits of a relay service's relayed connections. libp2p's defaults (128
// KiB and 2 minutes per connection) suit only the signalling before hole
// punching; a peer behind a NAT that cannot hole-punch trains through
// its relay, so Skyhive's relays allow long, large connections. Each is
// still bounded, and so are reservations (128) and circuits per peer (16).
const (
	RelayConnData     = 4 << 30 // bytes each way per relayed connection
	RelayConnDuration = 2 * time.Hour
	relayBufferSize   = 64 << 10
)

// RelayResources are the limits of Skyhive's relay service: libp2p's
// defaults with RelayConnData and RelayConnDuration per relayed connection
// and 64 KiB copy buffers.
func RelayResources() relayv2.Resources {
	r := relayv2.DefaultResources()
	r.Limit = &relayv2.RelayLimit{Duration: RelayConnDuration, Data: RelayConnData}
	r.BufferSize = relayBufferSize
	return r
}
