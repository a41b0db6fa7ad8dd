package p2p

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/libp2p/go-libp2p/core/crypto"
	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/core/protocol"
	ma "github.com/multiformats/go-multiaddr"
)

// AdmitProtocol is the handshake by which two peers of a closed swarm show
// each other that they are members.
const AdmitProtocol protocol.ID = "/skyhive/admit/1"

// Admission closes a swarm to strangers. A peer proves membership either by
// knowing the swarm's shared Secret, or by a member token that the swarm
// key signed for its peer ID (SwarmKey and Token). Peers prove it to each
// other once per connection, right after the connection opens
// (AdmitProtocol); until a peer is admitted every Skyhive protocol refuses
// its streams before reading from them, and an inbound connection whose peer
// is not admitted within Timeout is closed. libp2p's own protocols
// (identify, ping, AutoNAT, hole punching) stay open during that time; a
// relay serves only admitted peers.
type Admission struct {
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

// DefaultAdmitTimeout is Admission.Timeout's default.
const DefaultAdmitTimeout = 10 * time.Second

// ErrNotAdmitted reports a peer that did not prove it belongs to the swarm,
// or a swarm that did not admit this host.
var ErrNotAdmitted = errors.New("p2p: not admitted")

// Proof kinds on the wire.
const (
	proofSecret byte = 1
	proofToken  byte = 2
	proofRefuse byte = 0xff
)

// errClosedSwarm is what a peer that is not admitted is told.
const errClosedSwarm = "not admitted: this swarm is closed to peers that are not its members (start with the swarm's --swarm-secret, or --swarm-key and --member-token)"

// maxProofBytes bounds a proof (a token is well under 300 bytes).
const maxProofBytes = 1024

func (a *Admission) validate() error {
	switch {
	case a.Secret != nil && a.SwarmKey != nil:
		return errors.New("p2p: admission: choose a swarm secret or a swarm key, not both")
	case a.Secret != nil:
		if len(a.Secret) < 16 {
			return fmt.Errorf("p2p: admission: the swarm secret has %d bytes; use at least 16 (skyhive keygen secret)", len(a.Secret))
		}
	case a.SwarmKey != nil:
		if a.Token == nil {
			return errors.New("p2p: admission: a swarm key needs this peer's member token (skyhive keygen token)")
		}
	default:
		return errors.New("p2p: admission: needs a swarm secret or a swarm key")
	}
	return nil
}

// checkToken verifies that the host's own token is valid for id.
func (a *Admission) checkToken(id peer.ID, now time.Time) error {
	if a.SwarmKey == nil {
		return nil
	}
	if err := a.Token.Verify(a.SwarmKey, id, now); err != nil {
		return fmt.Errorf("p2p: this host's member token: %w", err)
	}
	return nil
}

// proof is what this host sends to verifier to prove membership.
func (a *Admission) proof(self, verifier peer.ID) []byte {
	if a.Secret != nil {
		return append([]byte{proofSecret}, secretMAC(a.Secret, self, verifier)...)
	}
	return append([]byte{proofToken}, a.Token.Marshal()...)
}

// verify checks prover's proof addressed to self. It returns when the
// admission lapses (the zero time: never).
func (a *Admission) verify(b []byte, prover, self peer.ID, now time.Time) (time.Time, error) {
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
	m.Write([]byte(AdmitProtocol))
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

// MemberToken is the swarm key's signature on a peer ID: the bearer of that
// peer ID (proven by the connection's handshake) is a member until Expires.
type MemberToken struct {
	Peer    peer.ID
	Expires time.Time
	Sig     []byte
}

const tokenContext = "skyhive member token v1"

func tokenMessage(p peer.ID, expires time.Time) []byte {
	b := []byte(tokenContext)
	b = binary.BigEndian.AppendUint16(b, uint16(len(p)))
	b = append(b, p...)
	return binary.BigEndian.AppendUint64(b, uint64(expires.Unix()))
}

// NewMemberToken signs a token for p with the swarm's private key.
func NewMemberToken(swarmKey crypto.PrivKey, p peer.ID, expires time.Time) (*MemberToken, error) {
	if err := p.Validate(); err != nil {
		return nil, fmt.Errorf("p2p: member token: peer ID: %w", err)
	}
	expires = expires.Truncate(time.Second)
	sig, err := swarmKey.Sign(tokenMessage(p, expires))
	if err != nil {
		return nil, fmt.Errorf("p2p: member token: sign: %w", err)
	}
	return &MemberToken{Peer: p, Expires: expires, Sig: sig}, nil
}

// Verify checks the token's signature by swarmKey, that it was issued to p
// and that it has not expired at now.
func (t *MemberToken) Verify(swarmKey crypto.PubKey, p peer.ID, now time.Time) error {
	if t.Peer != p {
		return fmt.Errorf("member token of %s presented by %s", t.Peer.ShortString(), p.ShortString())
	}
	ok, err := swarmKey.Verify(tokenMessage(t.Peer, t.Expires), t.Sig)
	if err != nil || !ok {
		return errors.New("member token not signed by this swarm's key")
	}
	if !now.Before(t.Expires) {
		return fmt.Errorf("member token expired at %s", t.Expires.UTC().Format(time.RFC3339))
	}
	return nil
}

// Marshal encodes the token: peer ID length (2 bytes), peer ID, expiry
// (Unix seconds, 8 bytes), signature length (2 bytes), signature.
func (t *MemberToken) Marshal() []byte {
	b := binary.BigEndian.AppendUint16(nil, uint16(len(t.Peer)))
	b = append(b, t.Peer...)
	b = binary.BigEndian.AppendUint64(b, uint64(t.Expires.Unix()))
	b = binary.BigEndian.AppendUint16(b, uint16(len(t.Sig)))
	return append(b, t.Sig...)
}

// UnmarshalMemberToken decodes Marshal's encoding.
func UnmarshalMemberToken(b []byte) (*MemberToken, error) {
	if len(b) > maxProofBytes {
		return nil, errors.New("member token too long")
	}
	next := func(n int) ([]byte, bool) {
		if len(b) < n {
			return nil, false
		}
		v := b[:n]
		b = b[n:]
		return v, true
	}
	bad := errors.New("malformed member token")
	l, ok := next(2)
	if !ok {
		return nil, bad
	}
	id, ok := next(int(binary.BigEndian.Uint16(l)))
	if !ok {
		return nil, bad
	}
	exp, ok := next(8)
	if !ok {
		return nil, bad
	}
	if l, ok = next(2); !ok {
		return nil, bad
	}
	sig, ok := next(int(binary.BigEndian.Uint16(l)))
	if !ok || len(b) != 0 {
		return nil, bad
	}
	p, err := peer.IDFromBytes(id)
	if err != nil {
		return nil, fmt.Errorf("member token: %w", err)
	}
	secs := int64(binary.BigEndian.Uint64(exp))
	if secs < 0 || secs > 1<<40 {
		return nil, bad
	}
	return &MemberToken{Peer: p, Expires: time.Unix(secs, 0), Sig: append([]byte(nil), sig...)}, nil
}

// EncodeText encodes the token as one line of base64 text (for files).
func (t *MemberToken) EncodeText() string {
	return base64.StdEncoding.EncodeToString(t.Marshal()) + "\n"
}

// DecodeMemberTokenText decodes EncodeText's output.
func DecodeMemberTokenText(s string) (*MemberToken, error) {
	b, err := base64.StdEncoding.DecodeString(strings.TrimSpace(s))
	if err != nil {
		return nil, fmt.Errorf("member token: %w", err)
	}
	return UnmarshalMemberToken(b)
}

// EncodePublicKeyText encodes a public key as one line of base64 text.
func EncodePublicKeyText(k crypto.PubKey) (string, error) {
	b, err := crypto.MarshalPublicKey(k)
	if err != nil {
		return "", err
	}
	return base64.StdEncoding.EncodeToString(b) + "\n", nil
}

// DecodePublicKeyText decodes EncodePublicKeyText's output.
func DecodePublicKeyText(s string) (crypto.PubKey, error) {
	b, err := base64.StdEncoding.DecodeString(strings.TrimSpace(s))
	if err != nil {
		return nil, fmt.Errorf("public key: %w", err)
	}
	return crypto.UnmarshalPublicKey(b)
}

// admitState is a peer's admission: done is closed when the handshake
// ended; err is then its outcome.
type admitState struct {
	done    chan struct{}
	err     error
	expires time.Time // zero: never
}

// valid reports whether a finished handshake admitted the peer and the
// admission has not lapsed at now.
func (st *admitState) valid(now time.Time) bool {
	return st.err == nil && (st.expires.IsZero() || now.Before(st.expires))
}

// state returns p's admission state, nil if no handshake with p started.
func (h *Host) state(p peer.ID) *admitState {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.admitted[p]
}

// Admitted reports whether the peer has proven it belongs to the swarm
// (always true in an open swarm).
func (h *Host) Admitted(p peer.ID) bool {
	if h.cfg.Admission == nil {
		return true
	}
	st := h.state(p)
	if st == nil {
		return false
	}
	select {
	case <-st.done:
		return st.valid(h.now())
	default:
		return false
	}
}

func (h *Host) now() time.Time { return time.Now() }

// admit makes sure p and this host have admitted each other, running the
// handshake if no one has yet, and waiting for one in progress.
func (h *Host) admit(ctx context.Context, p peer.ID) error {
	if h.cfg.Admission == nil {
		return nil
	}
	h.mu.Lock()
	st := h.admitted[p]
	mine := false
	if st != nil {
		select {
		case <-st.done:
			if !st.valid(h.now()) {
				st = nil // failed or lapsed: try again
			}
		default:
		}
	}
	if st == nil {
		st = &admitState{done: make(chan struct{})}
		h.admitted[p] = st
		mine = true
	}
	h.mu.Unlock()
	if mine {
		st.expires, st.err = h.handshake(ctx, p)
		close(st.done)
	}
	select {
	case <-st.done:
		if st.err != nil {
			return st.err
		}
		return nil
	case <-ctx.Done():
		return fmt.Errorf("p2p: admission by %s: %w", p.ShortString(), ctx.Err())
	}
}

// handshake proves this host's membership to p and checks p's answer.
func (h *Host) handshake(ctx context.Context, p peer.ID) (time.Time, error) {
	a := h.cfg.Admission
	ctx, cancel := context.WithTimeout(ctx, a.Timeout)
	defer cancel()
	s, err := h.h.NewStream(network.WithAllowLimitedConn(ctx, "skyhive-admit"), p, AdmitProtocol)
	if err != nil {
		return time.Time{}, fmt.Errorf("%w by %s: %w", ErrNotAdmitted, p.ShortString(), err)
	}
	defer s.Close()
	stop := context.AfterFunc(ctx, func() { s.Reset() })
	defer stop()
	if dl, ok := ctx.Deadline(); ok {
		s.SetDeadline(dl)
	}
	if err := writeProof(s, a.proof(h.ID(), p)); err != nil {
		return time.Time{}, fmt.Errorf("%w by %s: send proof: %w", ErrNotAdmitted, p.ShortString(), err)
	}
	b, err := readProof(s)
	if err != nil {
		return time.Time{}, fmt.Errorf("%w by %s: read its proof: %w", ErrNotAdmitted, p.ShortString(), err)
	}
	exp, err := a.verify(b, p, h.ID(), h.now())
	if err != nil {
		s.Reset()
		h.closePeer(p)
		return time.Time{}, fmt.Errorf("%w: %s: %w", ErrNotAdmitted, p.ShortString(), err)
	}
	return exp, nil
}

// serveAdmit answers a peer's handshake: it checks the peer's proof and
// answers with this host's, or with the reason of the refusal.
func (h *Host) serveAdmit(s network.Stream) {
	a := h.cfg.Admission
	p := s.Conn().RemotePeer()
	s.SetDeadline(time.Now().Add(a.Timeout))
	b, err := readProof(s)
	if err != nil {
		s.Reset()
		return
	}
	exp, verr := a.verify(b, p, h.ID(), h.now())
	if verr != nil {
		h.warnPeer("p2p: refused a peer that is not a member of the swarm", "peer", p, "err", verr)
		writeProof(s, append([]byte{proofRefuse}, "not a member of this swarm: "+verr.Error()...))
		s.Close()
		h.refuseLater(p)
		return
	}
	st := &admitState{done: make(chan struct{}), expires: exp}
	close(st.done)
	h.mu.Lock()
	if old := h.admitted[p]; old != nil {
		select {
		case <-old.done:
			h.admitted[p] = st
		default: // our own handshake with p is running; it will decide
		}
	} else {
		h.admitted[p] = st
	}
	h.mu.Unlock()
	if err := writeProof(s, a.proof(h.ID(), p)); err != nil {
		s.Reset()
		return
	}
	s.Close()
}

// refuseLater closes the connections to a refused peer once it had a
// moment to read why.
func (h *Host) refuseLater(p peer.ID) {
	time.AfterFunc(time.Second, func() {
		if h.ctx.Err() == nil {
			h.closePeer(p)
		}
	})
}

func (h *Host) closePeer(p peer.ID) {
	for _, c := range h.h.Network().ConnsToPeer(p) {
		c.Close()
	}
}

// watchAdmission runs the handshake on every new outbound connection and
// closes inbound ones whose peer is not admitted in time; it forgets a
// peer's admission when its last connection closes.
func (h *Host) watchAdmission() {
	if h.cfg.Admission == nil {
		return
	}
	h.h.SetStreamHandler(AdmitProtocol, func(s network.Stream) {
		if !h.track() {
			s.Reset()
			return
		}
		defer h.handlers.Done()
		h.serveAdmit(s)
	})
	h.h.Network().Notify(&network.NotifyBundle{
		ConnectedF: func(_ network.Network, c network.Conn) {
			p := c.RemotePeer()
			if c.Stat().Direction == network.DirOutbound {
				if !h.track() {
					return
				}
				go func() {
					defer h.handlers.Done()
					if err := h.admit(h.ctx, p); err != nil && h.ctx.Err() == nil {
						h.log.Warn("p2p: a peer did not admit this host", "peer", p, "err", err)
					}
				}()
				return
			}
			time.AfterFunc(h.cfg.Admission.Timeout, func() {
				if h.ctx.Err() == nil && !h.Admitted(p) && !c.IsClosed() {
					h.log.Debug("p2p: closing a connection without admission", "peer", p)
					c.Close()
				}
			})
		},
		DisconnectedF: func(n network.Network, c network.Conn) {
			p := c.RemotePeer()
			if n.Connectedness(p) == network.Connected {
				return
			}
			h.mu.Lock()
			if st := h.admitted[p]; st != nil {
				select {
				case <-st.done:
					delete(h.admitted, p)
				default:
				}
			}
			h.mu.Unlock()
		},
	})
}

func writeProof(w io.Writer, b []byte) error {
	if len(b) > maxProofBytes {
		return errors.New("proof too long")
	}
	_, err := w.Write(append(binary.BigEndian.AppendUint16(nil, uint16(len(b))), b...))
	return err
}

func readProof(r io.Reader) ([]byte, error) {
	var hdr [2]byte
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		return nil, err
	}
	n := int(binary.BigEndian.Uint16(hdr[:]))
	if n > maxProofBytes {
		return nil, fmt.Errorf("proof of %d bytes over %d", n, maxProofBytes)
	}
	b := make([]byte, n)
	if _, err := io.ReadFull(r, b); err != nil {
		return nil, err
	}
	return b, nil
}

// relayACL lets a relay serve only admitted peers (h is set once the host
// exists; until then it refuses).
type relayACL struct{ h *Host }

func (a *relayACL) AllowReserve(p peer.ID, _ ma.Multiaddr) bool {
	return a.h != nil && a.h.waitAdmitted(p)
}

func (a *relayACL) AllowConnect(src peer.ID, _ ma.Multiaddr, dest peer.ID) bool {
	return a.h != nil && a.h.waitAdmitted(src) && a.h.Admitted(dest)
}

// gate decides whether a stream from p may be served: p is admitted, or its
// handshake is running and admits it within the timeout. A peer that never
// started one is refused at once.
func (h *Host) gate(p peer.ID) bool {
	if h.Blocked(p) {
		return false
	}
	if h.cfg.Admission == nil {
		return true
	}
	st := h.state(p)
	if st == nil {
		return false
	}
	t := time.NewTimer(h.cfg.Admission.Timeout)
	defer t.Stop()
	select {
	case <-st.done:
	case <-t.C:
		return false
	case <-h.ctx.Done():
		return false
	}
	return st.valid(h.now())
}

// waitAdmitted waits up to the admission timeout for p's handshake, which
// may still be running when p's first request arrives.
func (h *Host) waitAdmitted(p peer.ID) bool {
	if h.Admitted(p) {
		return true
	}
	ctx, cancel := context.WithTimeout(h.ctx, h.cfg.Admission.Timeout)
	defer cancel()
	return h.admit(ctx, p) == nil
}
