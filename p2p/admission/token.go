package admission

import (
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/libp2p/go-libp2p/core/crypto"
	"github.com/libp2p/go-libp2p/core/peer"
)

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
		return nil, fmt.Errorf("admission: member token: peer ID: %w", err)
	}
	expires = expires.Truncate(time.Second)
	sig, err := swarmKey.Sign(tokenMessage(p, expires))
	if err != nil {
		return nil, fmt.Errorf("admission: member token: sign: %w", err)
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
