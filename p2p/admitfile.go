package p2p

import (
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/libp2p/go-libp2p/core/crypto"
)

// maxAdmitFile bounds the admission files read from disk.
const maxAdmitFile = 16 << 10

// secretBytes is the size of a secret made by NewSwarmSecret.
const secretBytes = 32

// readSmall reads a file of at most maxAdmitFile bytes; private files
// readable by group or others are refused, as ssh does.
func readSmall(path string, private bool) ([]byte, error) {
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
	b, err := io.ReadAll(io.LimitReader(f, maxAdmitFile+1))
	if err != nil {
		return nil, err
	}
	if len(b) > maxAdmitFile {
		return nil, fmt.Errorf("%s is larger than %d bytes", path, maxAdmitFile)
	}
	return b, nil
}

// writeNew writes a new file atomically (temporary file, fsync, rename); it
// refuses to replace an existing one.
func writeNew(path string, b []byte, mode os.FileMode) error {
	if _, err := os.Stat(path); err == nil {
		return fmt.Errorf("%s exists; remove it or choose another file", path)
	} else if !errors.Is(err, os.ErrNotExist) {
		return err
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".tmp*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
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
	return os.Rename(tmp.Name(), path)
}

// NewSwarmSecret writes a new random swarm secret to path (mode 0600).
func NewSwarmSecret(path string) error {
	b := make([]byte, secretBytes)
	if _, err := rand.Read(b); err != nil {
		return fmt.Errorf("p2p: swarm secret: %w", err)
	}
	if err := writeNew(path, []byte(base64.StdEncoding.EncodeToString(b)+"\n"), 0o600); err != nil {
		return fmt.Errorf("p2p: swarm secret: %w", err)
	}
	return nil
}

// ReadSwarmSecret reads a secret written by NewSwarmSecret.
func ReadSwarmSecret(path string) ([]byte, error) {
	b, err := readSmall(path, true)
	if err != nil {
		return nil, fmt.Errorf("p2p: swarm secret: %w", err)
	}
	s, err := base64.StdEncoding.DecodeString(strings.TrimSpace(string(b)))
	if err != nil {
		return nil, fmt.Errorf("p2p: swarm secret %s: not base64: %w", path, err)
	}
	return s, nil
}

// NewSwarmKey creates a swarm key pair: the private key at path (mode
// 0600, the identity file format) and the public key, as one line of
// text, at path + ".pub". It returns the public key.
func NewSwarmKey(path string) (crypto.PubKey, error) {
	priv, pub, err := crypto.GenerateEd25519Key(rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("p2p: swarm key: %w", err)
	}
	b, err := crypto.MarshalPrivateKey(priv)
	if err != nil {
		return nil, fmt.Errorf("p2p: swarm key: %w", err)
	}
	txt, err := EncodePublicKeyText(pub)
	if err != nil {
		return nil, fmt.Errorf("p2p: swarm key: %w", err)
	}
	if _, err := os.Stat(path + ".pub"); err == nil {
		return nil, fmt.Errorf("p2p: swarm key: %s.pub exists; remove it or choose another file", path)
	}
	if err := writeNew(path, b, 0o600); err != nil {
		return nil, fmt.Errorf("p2p: swarm key: %w", err)
	}
	if err := writeNew(path+".pub", []byte(txt), 0o644); err != nil {
		return nil, fmt.Errorf("p2p: swarm key: %w", err)
	}
	return pub, nil
}

// ReadSwarmPrivateKey reads the private half written by NewSwarmKey.
func ReadSwarmPrivateKey(path string) (crypto.PrivKey, error) {
	b, err := readSmall(path, true)
	if err != nil {
		return nil, fmt.Errorf("p2p: swarm key: %w", err)
	}
	k, err := crypto.UnmarshalPrivateKey(b)
	if err != nil {
		return nil, fmt.Errorf("p2p: swarm key %s (the private key file, not .pub): %w", path, err)
	}
	return k, nil
}

// ReadSwarmPublicKey reads the public half written by NewSwarmKey.
func ReadSwarmPublicKey(path string) (crypto.PubKey, error) {
	b, err := readSmall(path, false)
	if err != nil {
		return nil, fmt.Errorf("p2p: swarm public key: %w", err)
	}
	k, err := DecodePublicKeyText(string(b))
	if err != nil {
		return nil, fmt.Errorf("p2p: swarm public key %s: %w", path, err)
	}
	return k, nil
}

// ReadMemberToken reads a token written as MemberToken.EncodeText.
func ReadMemberToken(path string) (*MemberToken, error) {
	b, err := readSmall(path, false)
	if err != nil {
		return nil, fmt.Errorf("p2p: member token: %w", err)
	}
	t, err := DecodeMemberTokenText(string(b))
	if err != nil {
		return nil, fmt.Errorf("p2p: member token %s: %w", path, err)
	}
	return t, nil
}

// WriteMemberToken writes t to a new file at path.
func WriteMemberToken(path string, t *MemberToken) error {
	if err := writeNew(path, []byte(t.EncodeText()), 0o644); err != nil {
		return fmt.Errorf("p2p: member token: %w", err)
	}
	return nil
}
