package p2p

import (
	"crypto/rand"
	"errors"
	"fmt"
	"io/fs"

	"github.com/libp2p/go-libp2p/core/crypto"

	"github.com/skyhive/skyhive/p2p/internal/keyfile"
)

// LoadOrCreateIdentity returns the private key stored at path, creating an
// Ed25519 key there (mode 0600, written atomically) if the file does not
// exist. An existing file readable by group or others is refused, as ssh
// does, since anyone who reads it can impersonate the peer.
func LoadOrCreateIdentity(path string) (crypto.PrivKey, error) {
	k, err := readPrivateKey(path)
	if errors.Is(err, fs.ErrNotExist) {
		return createIdentity(path)
	}
	return k, err
}

// readPrivateKey reads a private key file (the identity format).
func readPrivateKey(path string) (crypto.PrivKey, error) {
	b, err := keyfile.Read(path, true)
	if err != nil {
		return nil, fmt.Errorf("p2p: identity: %w", err)
	}
	k, err := crypto.UnmarshalPrivateKey(b)
	if err != nil {
		return nil, fmt.Errorf("p2p: parse identity %s: %w", path, err)
	}
	return k, nil
}

func createIdentity(path string) (crypto.PrivKey, error) {
	k, _, err := crypto.GenerateEd25519Key(rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("p2p: generate identity: %w", err)
	}
	b, err := crypto.MarshalPrivateKey(k)
	if err != nil {
		return nil, fmt.Errorf("p2p: marshal identity: %w", err)
	}
	// Two processes racing to create the identity agree on one key: the
	// loser loads the winner's file.
	if err := keyfile.Write(path, b, 0o600); errors.Is(err, fs.ErrExist) {
		return readPrivateKey(path)
	} else if err != nil {
		return nil, fmt.Errorf("p2p: create identity: %w", err)
	}
	return k, nil
}
