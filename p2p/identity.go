package p2p

import (
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/libp2p/go-libp2p/core/crypto"
)

// maxKeyFile bounds the identity file read from disk.
const maxKeyFile = 16 << 10

// LoadOrCreateIdentity returns the private key stored at path, creating an
// Ed25519 key there (mode 0600, written atomically) if the file does not
// exist. An existing file readable by group or others is refused, as ssh
// does, since anyone who reads it can impersonate the peer.
func LoadOrCreateIdentity(path string) (crypto.PrivKey, error) {
	f, err := os.Open(path)
	switch {
	case err == nil:
		defer f.Close()
		return readIdentity(f, path)
	case errors.Is(err, fs.ErrNotExist):
		return createIdentity(path)
	default:
		return nil, fmt.Errorf("p2p: open identity: %w", err)
	}
}

func readIdentity(f *os.File, path string) (crypto.PrivKey, error) {
	st, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("p2p: identity %s: %w", path, err)
	}
	if st.Mode().Perm()&0o077 != 0 {
		return nil, fmt.Errorf("p2p: identity %s has mode %v; it must not be accessible by group or others (chmod 600)", path, st.Mode().Perm())
	}
	b, err := io.ReadAll(io.LimitReader(f, maxKeyFile+1))
	if err != nil {
		return nil, fmt.Errorf("p2p: read identity %s: %w", path, err)
	}
	if len(b) > maxKeyFile {
		return nil, fmt.Errorf("p2p: identity %s is larger than %d bytes", path, maxKeyFile)
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
	dir := filepath.Dir(path)
	tmp, err := os.CreateTemp(dir, ".identity-*")
	if err != nil {
		return nil, fmt.Errorf("p2p: create identity: %w", err)
	}
	defer os.Remove(tmp.Name()) // no-op after a successful rename
	if err := tmp.Chmod(0o600); err != nil {
		tmp.Close()
		return nil, fmt.Errorf("p2p: create identity: %w", err)
	}
	if _, err := tmp.Write(b); err != nil {
		tmp.Close()
		return nil, fmt.Errorf("p2p: write identity: %w", err)
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return nil, fmt.Errorf("p2p: write identity: %w", err)
	}
	if err := tmp.Close(); err != nil {
		return nil, fmt.Errorf("p2p: write identity: %w", err)
	}
	// Link rather than rename so that two processes racing to create the
	// identity agree on one key: the loser loads the winner's file.
	if err := os.Link(tmp.Name(), path); err != nil {
		if errors.Is(err, fs.ErrExist) {
			f, err := os.Open(path)
			if err != nil {
				return nil, fmt.Errorf("p2p: open identity: %w", err)
			}
			defer f.Close()
			return readIdentity(f, path)
		}
		return nil, fmt.Errorf("p2p: install identity: %w", err)
	}
	return k, nil
}
