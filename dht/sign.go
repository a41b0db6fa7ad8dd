package dht

import (
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"strings"
	"sync"

	"github.com/libp2p/go-libp2p/core/crypto"
	"github.com/libp2p/go-libp2p/core/peer"
)

// Signed records. A key or subkey containing OwnerMarker(id), and a subkey
// that is exactly a peer ID's string form (as the averaging declarations
// and progress records use: one subkey per peer), may only be stored with
// a signature by id's private key over the key, subkey, value and
// expiration, so nobody else can overwrite or forge it. The owner's
// public key must be recoverable from its peer ID (ed25519 or secp256k1
// identities, which embed the key); a subkey naming a peer whose ID does
// not embed its key is not owned. Every node checks the signature before
// storing and every reader before using a record; Node.Store signs with
// the node's key, so callers need not do anything.

const (
	ownerPrefix = "[owner:"
	ownerSuffix = "]"
	signDomain  = "skyhive/dht/record/v1\x00"
)

// Signature errors.
var (
	// ErrBadSignature means an owner-marked record carries no valid
	// signature of its owner.
	ErrBadSignature = errors.New("dht: bad record signature")
	// ErrNotOwner means the node was asked to store a record owned by
	// another peer, which it cannot sign.
	ErrNotOwner = errors.New("dht: record is owned by another peer")
)

// OwnerMarker returns the marker that, placed in a key or subkey, makes the
// record writable only by id.
func OwnerMarker(id peer.ID) string { return ownerPrefix + id.String() + ownerSuffix }

// owner finds the owner marker in key and subkey, or the peer a subkey
// names. It fails if a marker is malformed or two markers name different
// owners.
func owner(key, subkey string) (peer.ID, bool, error) {
	var found peer.ID
	if id, ok := subkeyOwner(subkey); ok {
		found = id
	}
	for _, s := range [2]string{key, subkey} {
		for i := 0; i < len(s); {
			j := strings.Index(s[i:], ownerPrefix)
			if j < 0 {
				break
			}
			start := i + j + len(ownerPrefix)
			end := strings.Index(s[start:], ownerSuffix)
			if end < 0 {
				return "", false, fmt.Errorf("%w: unterminated owner marker", ErrBadSignature)
			}
			id, err := peer.Decode(s[start : start+end])
			if err != nil {
				return "", false, fmt.Errorf("%w: owner marker: %w", ErrBadSignature, err)
			}
			if found != "" && found != id {
				return "", false, fmt.Errorf("%w: two owners", ErrBadSignature)
			}
			found = id
			i = start + end + len(ownerSuffix)
		}
	}
	return found, found != "", nil
}

// subkeyOwner reports the peer whose ID subkey is, in canonical form, if
// that ID embeds its public key.
func subkeyOwner(subkey string) (peer.ID, bool) {
	// Identity-multihash IDs are 46 (ed25519) to 60-odd characters.
	if len(subkey) < 40 || len(subkey) > 100 || strings.Contains(subkey, ownerPrefix) {
		return "", false
	}
	id, err := peer.Decode(subkey)
	if err != nil || id.String() != subkey {
		return "", false
	}
	if _, err := id.ExtractPublicKey(); err != nil {
		return "", false
	}
	return id, true
}

// signedBytes is the message an owner signs: a domain tag, then key,
// subkey and value each prefixed by its length, then the expiration.
func signedBytes(e *entry) []byte {
	b := make([]byte, 0, len(signDomain)+len(e.Key)+len(e.Subkey)+len(e.Value)+3*binary.MaxVarintLen64+8)
	b = append(b, signDomain...)
	for _, f := range [2]string{e.Key, e.Subkey} {
		b = binary.AppendUvarint(b, uint64(len(f)))
		b = append(b, f...)
	}
	b = binary.AppendUvarint(b, uint64(len(e.Value)))
	b = append(b, e.Value...)
	return binary.BigEndian.AppendUint64(b, uint64(e.Expiration))
}

// Subkey items of unowned keys are signed by their writer: the signature
// field then holds the writer's peer ID (one length byte, the ID bytes)
// followed by its signature. A replica keeps a live subkey item's writer
// as its owner: no other peer may replace it until it expires (see
// storage). Unsigned subkey items (from nodes without a key) are still
// accepted but never replace a signed one.

// validateSignature checks an entry's signature and records its writer:
// the owner for owner-marked entries, the signer for signed subkey items,
// "" for unsigned ones. Plain unowned values must carry no signature.
func validateSignature(e *entry) error {
	return validateWith(e, nil)
}

// verified remembers signatures that verified, so that the same record
// returned by several replicas, or read again, is checked once. It is
// cleared when full. Safe for concurrent use.
type verified struct {
	mu   sync.Mutex
	seen map[[sha256.Size]byte]struct{}
}

const maxVerified = 1 << 16

// validateWith is validateSignature that skips the signature check for
// records v has seen verify (v may be nil).
func validateWith(e *entry, v *verified) error {
	e.writer = ""
	id, ok, err := owner(e.Key, e.Subkey)
	if err != nil {
		return err
	}
	sig := e.Signature
	if !ok {
		if len(sig) == 0 {
			return nil
		}
		if e.Subkey == "" {
			return fmt.Errorf("%w: signature on an unowned record", ErrBadSignature)
		}
		n := int(sig[0])
		if n == 0 || 1+n > len(sig) {
			return fmt.Errorf("%w: malformed writer", ErrBadSignature)
		}
		if id, err = peer.IDFromBytes(sig[1 : 1+n]); err != nil {
			return fmt.Errorf("%w: writer: %w", ErrBadSignature, err)
		}
		sig = sig[1+n:]
	}
	if len(sig) == 0 {
		return fmt.Errorf("%w: missing", ErrBadSignature)
	}
	msg := signedBytes(e)
	var h [sha256.Size]byte
	if v != nil {
		d := sha256.New()
		d.Write(msg)
		d.Write([]byte(id))
		d.Write(sig)
		d.Sum(h[:0])
		v.mu.Lock()
		_, ok := v.seen[h]
		v.mu.Unlock()
		if ok {
			e.writer = string(id)
			return nil
		}
	}
	pub, err := id.ExtractPublicKey()
	if err != nil {
		return fmt.Errorf("%w: signer key: %w", ErrBadSignature, err)
	}
	valid, err := pub.Verify(msg, sig)
	if err != nil || !valid {
		return fmt.Errorf("%w: does not verify for %s", ErrBadSignature, id.ShortString())
	}
	if v != nil {
		v.mu.Lock()
		if v.seen == nil || len(v.seen) >= maxVerified {
			v.seen = make(map[[sha256.Size]byte]struct{})
		}
		v.seen[h] = struct{}{}
		v.mu.Unlock()
	}
	e.writer = string(id)
	return nil
}

// sign signs e: an owner-marked entry, whose owner must be self, with the
// owner's signature; a subkey item of an unowned key with a writer
// signature if priv is set. Plain unowned values stay unsigned.
func sign(e *entry, self peer.ID, priv crypto.PrivKey) error {
	e.Signature, e.writer = nil, ""
	id, ok, err := owner(e.Key, e.Subkey)
	if err != nil {
		return err
	}
	if !ok && (e.Subkey == "" || priv == nil) {
		return nil
	}
	if ok && (id != self || priv == nil) {
		return fmt.Errorf("%w: %s", ErrNotOwner, id.ShortString())
	}
	sig, err := priv.Sign(signedBytes(e))
	if err != nil {
		return fmt.Errorf("dht: sign record: %w", err)
	}
	if !ok {
		// Writer signature: the signer's ID, then the signature. Peer
		// IDs that embed a key are at most a few dozen bytes.
		idb := []byte(self)
		if len(idb) > 255 || len(idb)+1+len(sig) > MaxSignatureLen {
			return nil
		}
		sig = append(append([]byte{byte(len(idb))}, idb...), sig...)
	}
	e.Signature, e.writer = sig, string(self)
	return nil
}
