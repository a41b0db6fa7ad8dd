package launch

import (
	"fmt"
	"strings"

	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/skyhive/skyhive/p2p"
	"github.com/skyhive/skyhive/p2p/admission"
)

// MinMemoryMiB is the smallest memory budget (Net.MemoryMiB) other than 0:
// below it the Go runtime and libp2p alone would exceed it.
const MinMemoryMiB = 64

// FieldError is an invalid option of a config: Text says what is wrong,
// with a %s standing for each of Fields in turn, the options at fault by
// their JSON names; Err is the cause, if any.
type FieldError struct {
	Fields []string
	Text   string
	Err    error
}

func (e *FieldError) Error() string {
	s := e.Text
	for _, f := range e.Fields {
		s = strings.Replace(s, "%s", f, 1)
	}
	if e.Err != nil {
		s += ": " + e.Err.Error()
	}
	return s
}

// Unwrap returns the cause.
func (e *FieldError) Unwrap() error { return e.Err }

// Renamed returns the error with its fields renamed by name: how a
// command names its options (flags) instead of the config's fields.
func (e *FieldError) Renamed(name func(field string) string) *FieldError {
	r := *e
	r.Fields = make([]string, len(e.Fields))
	for i, f := range e.Fields {
		r.Fields[i] = name(f)
	}
	return &r
}

// fieldErr is a FieldError.
func fieldErr(err error, text string, fields ...string) *FieldError {
	return &FieldError{Fields: fields, Text: text, Err: err}
}

// HostConfig is the host configuration n describes. It validates the
// memory budget (of which a quarter bounds libp2p), parses the relays, reads
// the swarm's admission files and checks the reachability; errors are
// *FieldError.
func (n Net) HostConfig() (p2p.Config, error) {
	cfg := p2p.Config{ListenAddrs: n.Listen, AnnounceAddrs: n.Announce, IdentityFile: n.Identity,
		RelayService: n.RelayService, HolePunching: n.HolePunching, AutoNAT: n.AutoNAT, RelayClient: true}
	if m := n.MemoryMiB; m < 0 || (m > 0 && m < MinMemoryMiB) {
		return cfg, fieldErr(nil, fmt.Sprintf("%s: %d MiB; give at least %d MiB, or 0 for no limit", "%s", m, MinMemoryMiB), "memory_budget")
	}
	cfg.MemoryBudget = n.MemoryMiB << 20 / 4
	var err error
	if cfg.StaticRelays, err = p2p.ParseAddrInfos(n.Relays); err != nil {
		return cfg, fieldErr(err, "%s", "relay")
	}
	if cfg.Admission, err = n.Admission(); err != nil {
		return cfg, err
	}
	switch n.Reachability {
	case "auto":
	case "public":
		cfg.Reachability = p2p.ReachabilityPublic
	case "private":
		cfg.Reachability = p2p.ReachabilityPrivate
	default:
		return cfg, fieldErr(nil, fmt.Sprintf("%s: want auto, public or private, got %q", "%s", n.Reachability), "reachability")
	}
	return cfg, nil
}

// Admission reads the files that close the swarm: SwarmSecret, or SwarmKey
// and MemberToken; nil is an open swarm. Errors are *FieldError.
func (n Net) Admission() (*admission.Config, error) {
	switch {
	case n.SwarmSecret != "" && n.SwarmKey != "":
		return nil, fieldErr(nil, "%s and %s: choose one way to close the swarm", "swarm_secret", "swarm_key")
	case n.SwarmSecret != "":
		if n.MemberToken != "" {
			return nil, fieldErr(nil, "%s goes with %s, not %s", "member_token", "swarm_key", "swarm_secret")
		}
		s, err := admission.ReadSwarmSecret(n.SwarmSecret)
		if err != nil {
			return nil, fieldErr(err, "%s", "swarm_secret")
		}
		return &admission.Config{Secret: s}, nil
	case n.SwarmKey != "":
		if n.MemberToken == "" {
			return nil, fieldErr(nil, "%s needs %s: this peer's token, made with skyhive keygen token --peer ID", "swarm_key", "member_token")
		}
		k, err := admission.ReadSwarmPublicKey(n.SwarmKey)
		if err != nil {
			return nil, fieldErr(err, "%s", "swarm_key")
		}
		t, err := admission.ReadMemberToken(n.MemberToken)
		if err != nil {
			return nil, fieldErr(err, "%s", "member_token")
		}
		return &admission.Config{SwarmKey: k, Token: t}, nil
	case n.MemberToken != "":
		return nil, fieldErr(nil, "%s needs %s", "member_token", "swarm_key")
	}
	return nil, nil
}

// Seeds parses DHT, the swarm's DHT peers; an error is a *FieldError.
func (n Net) Seeds() ([]peer.AddrInfo, error) {
	s, err := p2p.ParseAddrInfos(n.DHT)
	if err != nil {
		return nil, fieldErr(err, "%s", "dht")
	}
	return s, nil
}

// DHTMaxBytes bounds the records a DHT node stores: an eighth of the
// memory budget, or the DHT's default (0) without one.
func (n Net) DHTMaxBytes() int { return int(n.MemoryMiB << 20 / 8) }
