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

// maxKeyFile bounds the identity, swarm key, secret and token files read
// from disk.
const maxKeyFile = 16 << 10

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
	b, err := readKeyFile(path, true)
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
	if err := writeKeyFile(path, b, 0o600); errors.Is(err, fs.ErrExist) {
		return readPrivateKey(path)
	} else if err != nil {
		return nil, fmt.Errorf("p2p: create identity: %w", err)
	}
	return k, nil
}

// readKeyFile reads a file of at most maxKeyFile bytes; a private one
// readable by group or others is refused, as ssh does. A missing file is
// an error wrapping fs.ErrNotExist.
func readKeyFile(path string, private bool) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	if private {
		st, err := f.Stat()
		if err != nil {
			return nil, err
		}
		if st.Mode().Perm()&0o077 != 0 {
			return nil, fmt.Errorf("%s has mode %v; it must not be accessible by group or others (chmod 600)", path, st.Mode().Perm())
		}
	}
	b, err := io.ReadAll(io.LimitReader(f, maxKeyFile+1))
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", path, err)
	}
	if len(b) > maxKeyFile {
		return nil, fmt.Errorf("%s is larger than %d bytes", path, maxKeyFile)
	}
	return b, nil
}

// writeKeyFile writes b to a new file at path with mode: a synced temporary
// file in the same directory, linked into place, so that a reader never
// sees a partial file. An existing file is left alone and the error wraps
// fs.ErrExist.
func writeKeyFile(path string, b []byte, mode os.FileMode) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".tmp*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name()) // the link, if made, keeps the file
	if err := tmp.Chmod(mode); err != nil {
		tmp.Close()
		return err
	}
	if _, err := tmp.Write(b); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	// Link, unlike rename, fails if path exists.
	if err := os.Link(tmp.Name(), path); err != nil {
		if errors.Is(err, fs.ErrExist) {
			return fmt.Errorf("%s exists; remove it or choose another file: %w", path, fs.ErrExist)
		}
		return err
	}
	return nil
}
