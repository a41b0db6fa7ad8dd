package node

import (
	"errors"
	"fmt"
	"io"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/skyhive/skyhive/launch"
	"github.com/skyhive/skyhive/metrics"
	"github.com/skyhive/skyhive/p2p"
	"github.com/skyhive/skyhive/p2p/admission"
)

// ErrConfig wraps every configuration the node refuses.
var ErrConfig = errors.New("node: bad configuration")

// ErrJoin means the node could not join the DHT through its bootstrap
// peers; New's error names them and says what to check.
var ErrJoin = errors.New("cannot join the DHT")

// DHT modes of DHTConfig.Mode.
const (
	// DHTServer stores and serves records for others: the mode of nodes
	// others can reach (DHT nodes, expert servers, averaging peers).
	DHTServer = "server"
	// DHTClient only reads and writes through others: the mode of
	// short-lived or unreachable nodes (clients, trainers, dashboards).
	DHTClient = "client"
	// DHTOff runs no DHT node.
	DHTOff = "off"
)

// DefaultJoinTimeout bounds joining the DHT unless DHTConfig.JoinTimeout
// says otherwise.
const DefaultJoinTimeout = time.Minute

// maxRegion bounds StatusConfig.Region (as a status record does).
const maxRegion = 64

// Config configures a node. Zero fields take the defaults noted. The
// JSON-tagged fields are data a launcher can hand to a child process
// (durations in nanoseconds, as encoding/json writes a time.Duration); the
// fields tagged "-" are set in-process only.
type Config struct {
	// Net is how the node's libp2p host joins the network.
	Net NetConfig `json:"net"`
	// DHT is the node's DHT membership.
	DHT DHTConfig `json:"dht"`
	// Status is the node's signed status record in the DHT.
	Status StatusConfig `json:"status"`
	// MetricsAddr, if set, serves the node's Prometheus registry (a new
	// one, with the Go runtime and process collectors) on
	// http://MetricsAddr/metrics (host:port; port 0 picks a free one).
	MetricsAddr string `json:"metrics_addr,omitempty"`
	// CheckpointDir is a directory the role may keep its checkpoints in;
	// New creates it if it is missing ("": none).
	CheckpointDir string `json:"checkpoint_dir,omitempty"`
	// ServeDialback answers other peers' dial-back checks
	// (p2p.DialbackProtocol): for nodes that others can reach.
	ServeDialback bool `json:"serve_dialback,omitempty"`

	// Host, if set, is the host's configuration as built in-process (a
	// p2p.Config holds parsed admission keys, which JSON does not carry);
	// it replaces Net, which must then be zero. Its Metrics, if nil, is
	// the node's registerer.
	Host *p2p.Config `json:"-"`
	// Metrics, if set and MetricsAddr is not, is the registerer the host,
	// the DHT node and the role report to (e.g. one the process serves
	// already). Nil without MetricsAddr: no metrics.
	Metrics prometheus.Registerer `json:"-"`
	// DHTTransport, if set, wraps the host as the DHT node's transport
	// (e.g. an emulated link, netem.NewTransport); nil: the host itself.
	DHTTransport func(p2p.Transport) (p2p.Transport, error) `json:"-"`
	// OnReach, if set, is called with where others reach the node, now
	// and whenever AutoNAT's verdict changes, until Close.
	OnReach func(p2p.Reach) `json:"-"`
	// Log receives the node's notices: where its metrics are served,
	// failures to join an optional DHT and to publish the status record
	// (nil: none).
	Log io.Writer `json:"-"`
}

// NetConfig is the connectivity of the node's host: the settings of
// p2p.Config, with addresses as multiaddr strings and keys as file paths.
type NetConfig struct {
	// Listen are multiaddrs to listen on (none: all interfaces, TCP and
	// QUIC, free ports); Announce, if set, replace them in what the host
	// tells others.
	Listen   []string `json:"listen,omitempty"`
	Announce []string `json:"announce,omitempty"`
	// Identity is the private key file (created if missing; "": a new
	// peer ID on every start).
	Identity string `json:"identity,omitempty"`
	// Relays are circuit relays to reserve a slot on when not publicly
	// reachable (multiaddrs ending in /p2p/ID); RelayClient dials and
	// accepts relayed connections; RelayService relays for others when
	// publicly reachable.
	Relays       []string `json:"relay,omitempty"`
	RelayClient  bool     `json:"relay_client,omitempty"`
	RelayService bool     `json:"relay_service,omitempty"`
	// HolePunching upgrades relayed connections to direct ones (DCUtR);
	// AutoNAT learns the host's reachability from others and answers
	// their probes; Reachability overrides AutoNAT's verdict: "" or
	// "auto", "public" or "private".
	HolePunching bool   `json:"hole_punching,omitempty"`
	AutoNAT      bool   `json:"autonat,omitempty"`
	Reachability string `json:"reachability,omitempty"`
	// SwarmSecret is the swarm's secret file, or SwarmKey the swarm key's
	// .pub file with MemberToken this node's token: only peers that prove
	// they belong to the swarm may talk to the node (none: an open swarm).
	SwarmSecret string `json:"swarm_secret,omitempty"`
	SwarmKey    string `json:"swarm_key,omitempty"`
	MemberToken string `json:"member_token,omitempty"`
	// MemoryBudget sizes libp2p's resource manager in bytes (0: an eighth
	// of the machine's memory).
	MemoryBudget int64 `json:"memory_budget,omitempty"`
	// MaxMessageBytes bounds a call's request and response, and
	// MaxStreamBytes one direction of a streamed call (0: p2p's defaults).
	MaxMessageBytes int   `json:"max_message_bytes,omitempty"`
	MaxStreamBytes  int64 `json:"max_stream_bytes,omitempty"`
	// PendingPerAddress is p2p.Config.MaxPendingPerAddr (0: its default).
	PendingPerAddress int `json:"pending_per_address,omitempty"`
}

// DHTConfig is the node's DHT membership.
type DHTConfig struct {
	// Mode is DHTServer (the default), DHTClient or DHTOff.
	Mode string `json:"mode,omitempty"`
	// Bootstrap are DHT peers to join through (multiaddrs ending in
	// /p2p/PEER_ID); none: this node starts a DHT (server mode only).
	Bootstrap []string `json:"bootstrap,omitempty"`
	// JoinTimeout bounds joining (DefaultJoinTimeout).
	JoinTimeout time.Duration `json:"join_timeout,omitempty"`
	// Optional joins in the background, New not waiting: the outcome is a
	// notice on Log, not an error. A node that failed to join keeps its
	// DHT node, which others may join and which refreshes its routing
	// table through whoever contacts it.
	Optional bool `json:"optional,omitempty"`
	// MaxBytes bounds the records the node stores for others (0: dht's
	// default).
	MaxBytes int `json:"max_bytes,omitempty"`
}

// StatusConfig is the node's status record (metrics.Status), published in
// the DHT once the role calls Node.StartStatus.
type StatusConfig struct {
	// Role is the role of the record, one of the metrics.Role constants
	// (required when Every is set).
	Role string `json:"role,omitempty"`
	// Region is where the node runs ("" if unknown; at most 64 bytes of
	// printable text).
	Region string `json:"region,omitempty"`
	// Every is how often the record is stored (0: never; else between
	// metrics.MinStatusPeriod and metrics.MaxStatusPeriod).
	Every time.Duration `json:"every,omitempty"`
}

// Validate reports what is wrong with c, wrapping ErrConfig. It does not
// read the files c names; New does.
func (c *Config) Validate() error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: %s", ErrConfig, fmt.Sprintf(format, args...))
	}
	if c.Host != nil && !c.Net.zero() {
		return bad("give the host's configuration either as Net or in-process as Host, not both")
	}
	if err := c.Net.validate(); err != nil {
		return err
	}
	switch c.DHT.Mode {
	case "", DHTServer, DHTClient, DHTOff:
	default:
		return bad("DHT mode %q: want %s, %s or %s", c.DHT.Mode, DHTServer, DHTClient, DHTOff)
	}
	if _, err := c.DHT.seeds(); err != nil {
		return err
	}
	switch {
	case c.DHT.Mode == DHTClient && len(c.DHT.Bootstrap) == 0:
		return bad("a DHT client needs bootstrap peers: the multiaddr of a DHT node, ending in /p2p/PEER_ID")
	case c.DHT.Mode == DHTOff && len(c.DHT.Bootstrap) > 0:
		return bad("bootstrap peers given with the DHT off")
	case c.DHT.JoinTimeout < 0 || c.DHT.MaxBytes < 0:
		return bad("negative DHT join timeout %v or record bytes %d", c.DHT.JoinTimeout, c.DHT.MaxBytes)
	}
	return c.Status.validate(c.DHT.Mode == DHTOff)
}

func (s *StatusConfig) validate(dhtOff bool) error {
	switch {
	case s.Every == 0:
		return nil
	case s.Every < metrics.MinStatusPeriod || s.Every > metrics.MaxStatusPeriod:
		return fmt.Errorf("%w: status every %v: want 0 (off) or between %v and %v", ErrConfig, s.Every, metrics.MinStatusPeriod, metrics.MaxStatusPeriod)
	case !metrics.KnownRole(s.Role):
		return fmt.Errorf("%w: status role %q: want one of the metrics.Role constants", ErrConfig, s.Role)
	case len(s.Region) > maxRegion || !utf8.ValidString(s.Region) || strings.ContainsFunc(s.Region, func(r rune) bool { return !unicode.IsPrint(r) }):
		return fmt.Errorf("%w: region %q: want at most %d bytes of printable text", ErrConfig, s.Region, maxRegion)
	case dhtOff:
		return fmt.Errorf("%w: a status record is published in the DHT, which is off", ErrConfig)
	}
	return nil
}

func (c *NetConfig) zero() bool {
	return len(c.Listen) == 0 && len(c.Announce) == 0 && c.Identity == "" && len(c.Relays) == 0 &&
		!c.RelayClient && !c.RelayService && !c.HolePunching && !c.AutoNAT && c.Reachability == "" &&
		c.SwarmSecret == "" && c.SwarmKey == "" && c.MemberToken == "" &&
		c.MemoryBudget == 0 && c.MaxMessageBytes == 0 && c.MaxStreamBytes == 0 && c.PendingPerAddress == 0
}

func (c *NetConfig) validate() error {
	if _, err := c.reachability(); err != nil {
		return err
	}
	if _, err := p2p.ParseAddrInfos(c.Relays); err != nil {
		return configErr(err, "%s", "relay")
	}
	if _, err := c.admission(false); err != nil {
		return err
	}
	if c.MemoryBudget < 0 || c.MaxMessageBytes < 0 || c.MaxStreamBytes < 0 || c.PendingPerAddress < 0 {
		return configErr(nil, "%s, %s, %s or %s: negative", "memory_budget", "max_message_bytes", "max_stream_bytes", "pending_per_address")
	}
	return nil
}

// configErr is a configuration error about the options fields (by the JSON
// names of launch.Net, which a command renames to its flags): text with a
// %s for each field, and its cause err (nil: none). It wraps ErrConfig.
func configErr(err error, text string, fields ...string) error {
	return fmt.Errorf("%w: %w", ErrConfig, launch.NewFieldError(err, text, fields...))
}

func (c *NetConfig) reachability() (p2p.Reachability, error) {
	switch c.Reachability {
	case "", "auto":
		return p2p.ReachabilityAuto, nil
	case "public":
		return p2p.ReachabilityPublic, nil
	case "private":
		return p2p.ReachabilityPrivate, nil
	}
	return 0, configErr(nil, fmt.Sprintf("%s: want auto, public or private, got %q", "%s", c.Reachability), "reachability")
}

// admission checks the files that close the swarm (SwarmSecret, or
// SwarmKey and MemberToken) and, if read, reads them; nil is an open
// swarm.
func (c *NetConfig) admission(read bool) (*admission.Config, error) {
	switch {
	case c.SwarmSecret != "" && c.SwarmKey != "":
		return nil, configErr(nil, "%s and %s: choose one way to close the swarm", "swarm_secret", "swarm_key")
	case c.SwarmSecret != "" && c.MemberToken != "":
		return nil, configErr(nil, "%s goes with %s, not %s", "member_token", "swarm_key", "swarm_secret")
	case c.SwarmKey != "" && c.MemberToken == "":
		return nil, configErr(nil, "%s needs %s: this peer's token, made with skyhive keygen token --peer ID", "swarm_key", "member_token")
	case c.SwarmKey == "" && c.MemberToken != "":
		return nil, configErr(nil, "%s needs %s", "member_token", "swarm_key")
	case !read:
		return nil, nil
	case c.SwarmSecret != "":
		s, err := admission.ReadSwarmSecret(c.SwarmSecret)
		if err != nil {
			return nil, configErr(err, "%s", "swarm_secret")
		}
		return &admission.Config{Secret: s}, nil
	case c.SwarmKey != "":
		k, err := admission.ReadSwarmPublicKey(c.SwarmKey)
		if err != nil {
			return nil, configErr(err, "%s", "swarm_key")
		}
		t, err := admission.ReadMemberToken(c.MemberToken)
		if err != nil {
			return nil, configErr(err, "%s", "member_token")
		}
		return &admission.Config{SwarmKey: k, Token: t}, nil
	}
	return nil, nil
}

// HostConfig is the p2p.Config c describes; it reads the swarm's
// admission files. An error wraps ErrConfig and a *launch.FieldError that
// names the option at fault by launch.Net's JSON name.
func (c *NetConfig) HostConfig() (p2p.Config, error) {
	if err := c.validate(); err != nil {
		return p2p.Config{}, err
	}
	cfg := p2p.Config{
		ListenAddrs: c.Listen, AnnounceAddrs: c.Announce, IdentityFile: c.Identity,
		RelayClient: c.RelayClient, RelayService: c.RelayService, HolePunching: c.HolePunching, AutoNAT: c.AutoNAT,
		MemoryBudget: c.MemoryBudget, MaxMessageBytes: c.MaxMessageBytes, MaxStreamBytes: c.MaxStreamBytes,
		MaxPendingPerAddr: c.PendingPerAddress,
	}
	cfg.Reachability, _ = c.reachability()
	cfg.StaticRelays, _ = p2p.ParseAddrInfos(c.Relays)
	var err error
	cfg.Admission, err = c.admission(true)
	return cfg, err
}

// seeds parses the bootstrap peers.
func (c *DHTConfig) seeds() ([]peer.AddrInfo, error) {
	s, err := p2p.ParseAddrInfos(c.Bootstrap)
	if err != nil {
		return nil, fmt.Errorf("%w: DHT bootstrap peers: %v", ErrConfig, err)
	}
	return s, nil
}

// BootstrapAddrs returns the multiaddrs of infos as DHTConfig.Bootstrap
// takes them: each address followed by /p2p/PEER_ID.
func BootstrapAddrs(infos []peer.AddrInfo) []string {
	var s []string
	for _, in := range infos {
		if len(in.Addrs) == 0 {
			s = append(s, "/p2p/"+in.ID.String())
		}
		for _, a := range in.Addrs {
			s = append(s, a.String()+"/p2p/"+in.ID.String())
		}
	}
	return s
}
