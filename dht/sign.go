package dht

import (
	"encoding/binary"
	"errors"
	"fmt"
	"strings"

	"github.com/libp2p/go-libp2p/core/crypto"
	"github.com/libp2p/go-libp2p/core/peer"
)

// Signed records. A key or subkey containing OwnerMarker(id) may only be
// stored with a signature by id's private key over the key, subkey, value
// and expiration, so nobody else can overwrite or forge it. The owner's
// public key must be recoverable from its peer ID (ed25519 or secp256k1
// identities, which embed the key).

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

// owner finds the owner marker in key and subkey. It fails if a marker is
// malformed or two markers name different owners.
func owner(key, subkey string) (peer.ID, bool, error) {
	var found peer.ID
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

// validateSignature checks an owner-marked entry's signature; entries
// without a marker must carry none.
func validateSignature(e *entry) error {
	id, ok, err := owner(e.Key, e.Subkey)
	if err != nil {
		return err
	}
	if !ok {
		if len(e.Signature) != 0 {
			return fmt.Errorf("%w: signature on an unowned record", ErrBadSignature)
		}
		return nil
	}
	if len(e.Signature) == 0 {
		return fmt.Errorf("%w: missing", ErrBadSignature)
	}
	pub, err := id.ExtractPublicKey()
	if err != nil {
		return fmt.Errorf("%w: owner key: %w", ErrBadSignature, err)
	}
	valid, err := pub.Verify(signedBytes(e), e.Signature)
	if err != nil || !valid {
		return fmt.Errorf("%w: does not verify for %s", ErrBadSignature, id.ShortString())
	}
	return nil
}

// sign signs e if it carries an owner marker, which must be self's.
func sign(e *entry, self peer.ID, priv crypto.PrivKey) error {
	id, ok, err := owner(e.Key, e.Subkey)
	if err != nil || !ok {
		e.Signature = nil
		return err
	}
	if id != self || priv == nil {
		return fmt.Errorf("%w: %s", ErrNotOwner, id.ShortString())
	}
	sig, err := priv.Sign(signedBytes(e))
	if err != nil {
		return fmt.Errorf("dht: sign record: %w", err)
	}
	e.Signature = sig
	return nil
}
