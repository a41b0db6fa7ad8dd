// Package admission closes a swarm to strangers: peers prove to each
// other, once per connection, that they know the swarm's secret or hold a
// member token signed by the swarm key (Protocol). A Service runs the
// protocol on a libp2p host; p2p.Host starts one when its Config has
// Admission set and consults it before serving or opening a stream.
package admission

import (
	"crypto/hmac"
	"crypto/sha256"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/libp2p/go-libp2p/core/crypto"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/core/protocol"
)

// Protocol is the handshake by which two peers of a closed swarm show
// each other that they are members.
const Protocol protocol.ID = "/skyhive/admit/1.0.0"

// Config closes a swarm to strangers. A peer proves membership either by
// knowing the swarm's shared Secret, or by a member token that the swarm
// key signed for its peer ID (SwarmKey and Token). Peers prove it to each
// other once per connection, right after the connection opens
// (Protocol); until a peer is admitted every Skyhive protocol refuses
// its streams before reading from them, and an inbound connection whose peer
// is not admitted within Timeout is closed. libp2p's own protocols
// (identify, ping, AutoNAT, hole punching) stay open during that time; a
// relay serves only admitted peers.
type Config struct {
	// Secret is the swarm's shared secret (at least 16 bytes).
	Secret []byte
	// SwarmKey is the public key that signs member tokens.
	SwarmKey crypto.PubKey
	// Token is this host's member token, signed by the swarm key's
	// private half for this host's peer ID (see NewMemberToken).
	Token *MemberToken
	// Timeout bounds the handshake and how long an inbound connection may
	// stay open without one (default 10 s).
	Timeout time.Duration
}

// DefaultTimeout is Config.Timeout's default.
const DefaultTimeout = 10 * time.Second

// ErrNotAdmitted reports a peer that did not prove it belongs to the swarm,
// or a swarm that did not admit this host.
var ErrNotAdmitted = errors.New("admission: not admitted")

// Proof kinds on the wire.
const (
	proofSecret byte = 1
	proofToken  byte = 2
	proofRefuse byte = 0xff
)

// Refusal is what a peer that is not admitted is told when it opens a
// stream.
const Refusal = "not admitted: this swarm is closed to peers that are not its members (start with the swarm's --swarm-secret, or --swarm-key and --member-token)"

// maxProofBytes bounds a proof (a token is well under 300 bytes).
const maxProofBytes = 1024

func (a *Config) validate() error {
	switch {
	case a.Secret != nil && a.SwarmKey != nil:
		return errors.New("admission: choose a swarm secret or a swarm key, not both")
	case a.Secret != nil:
		if len(a.Secret) < 16 {
			return fmt.Errorf("admission: the swarm secret has %d bytes; use at least 16 (skyhive keygen secret)", len(a.Secret))
		}
	case a.SwarmKey != nil:
		if a.Token == nil {
			return errors.New("admission: a swarm key needs this peer's member token (skyhive keygen token)")
		}
	default:
		return errors.New("admission: needs a swarm secret or a swarm key")
	}
	return nil
}

// checkToken verifies that the host's own token is valid for id.
func (a *Config) checkToken(id peer.ID, now time.Time) error {
	if a.SwarmKey == nil {
		return nil
	}
	if err := a.Token.Verify(a.SwarmKey, id, now); err != nil {
		return fmt.Errorf("admission: this host's member token: %w", err)
	}
	return nil
}

// proof is what this host sends to verifier to prove membership.
func (a *Config) proof(self, verifier peer.ID) []byte {
	if a.Secret != nil {
		return append([]byte{proofSecret}, secretMAC(a.Secret, self, verifier)...)
	}
	return append([]byte{proofToken}, a.Token.Marshal()...)
}

// verify checks prover's proof addressed to self. It returns when the
// admission lapses (the zero time: never).
func (a *Config) verify(b []byte, prover, self peer.ID, now time.Time) (time.Time, error) {
	if len(b) == 0 {
		return time.Time{}, errors.New("empty proof")
	}
	kind, body := b[0], b[1:]
	switch {
	case kind == proofRefuse:
		return time.Time{}, fmt.Errorf("refused: %s", printable(body))
	case a.Secret != nil:
		if kind != proofSecret {
			return time.Time{}, errors.New("the peer does not prove it knows the swarm secret (is it started with the same --swarm-secret?)")
		}
		if !hmac.Equal(body, secretMAC(a.Secret, prover, self)) {
			return time.Time{}, errors.New("wrong swarm secret")
		}
		return time.Time{}, nil
	default:
		if kind != proofToken {
			return time.Time{}, errors.New("the peer shows no member token (is it started with --swarm-key and --member-token?)")
		}
		t, err := UnmarshalMemberToken(body)
		if err != nil {
			return time.Time{}, err
		}
		if err := t.Verify(a.SwarmKey, prover, now); err != nil {
			return time.Time{}, err
		}
		return t.Expires, nil
	}
}

// secretMAC binds the proof to both peer IDs, so it cannot be replayed to
// another peer or by another peer.
func secretMAC(secret []byte, prover, verifier peer.ID) []byte {
	m := hmac.New(sha256.New, secret)
	m.Write([]byte(Protocol))
	m.Write([]byte(prover))
	m.Write([]byte{0})
	m.Write([]byte(verifier))
	return m.Sum(nil)
}

func printable(b []byte) string {
	s := strings.ToValidUTF8(string(b), "?")
	if len(s) > 200 {
		s = s[:200]
	}
	return s
}
