package admission

import (
	"crypto/rand"
	"encoding/base64"
	"fmt"
	"os"
	"strings"

	"github.com/libp2p/go-libp2p/core/crypto"

	"github.com/skyhive/skyhive/p2p/internal/keyfile"
)

// secretBytes is the size of a secret made by NewSwarmSecret.
const secretBytes = 32

// NewSwarmSecret writes a new random swarm secret to path (mode 0600).
func NewSwarmSecret(path string) error {
	b := make([]byte, secretBytes)
	if _, err := rand.Read(b); err != nil {
		return fmt.Errorf("admission: swarm secret: %w", err)
	}
	if err := keyfile.Write(path, []byte(base64.StdEncoding.EncodeToString(b)+"\n"), 0o600); err != nil {
		return fmt.Errorf("admission: swarm secret: %w", err)
	}
	return nil
}

// ReadSwarmSecret reads a secret written by NewSwarmSecret.
func ReadSwarmSecret(path string) ([]byte, error) {
	b, err := keyfile.Read(path, true)
	if err != nil {
		return nil, fmt.Errorf("admission: swarm secret: %w", err)
	}
	s, err := base64.StdEncoding.DecodeString(strings.TrimSpace(string(b)))
	if err != nil {
		return nil, fmt.Errorf("admission: swarm secret %s: not base64: %w", path, err)
	}
	return s, nil
}

// NewSwarmKey creates a swarm key pair: the private key at path (mode
// 0600, the identity file format) and the public key, as one line of
// text, at path + ".pub". It returns the public key.
func NewSwarmKey(path string) (crypto.PubKey, error) {
	priv, pub, err := crypto.GenerateEd25519Key(rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("admission: swarm key: %w", err)
	}
	b, err := crypto.MarshalPrivateKey(priv)
	if err != nil {
		return nil, fmt.Errorf("admission: swarm key: %w", err)
	}
	txt, err := EncodePublicKeyText(pub)
	if err != nil {
		return nil, fmt.Errorf("admission: swarm key: %w", err)
	}
	if _, err := os.Stat(path + ".pub"); err == nil {
		return nil, fmt.Errorf("admission: swarm key: %s.pub exists; remove it or choose another file", path)
	}
	if err := keyfile.Write(path, b, 0o600); err != nil {
		return nil, fmt.Errorf("admission: swarm key: %w", err)
	}
	if err := keyfile.Write(path+".pub", []byte(txt), 0o644); err != nil {
		return nil, fmt.Errorf("admission: swarm key: %w", err)
	}
	return pub, nil
}

// ReadSwarmPrivateKey reads the private half written by NewSwarmKey (the
// identity file format, with the same checks).
func ReadSwarmPrivateKey(path string) (crypto.PrivKey, error) {
	b, err := keyfile.Read(path, true)
	if err != nil {
		return nil, fmt.Errorf("admission: swarm key (the private key file, not .pub): %w", err)
	}
	k, err := crypto.UnmarshalPrivateKey(b)
	if err != nil {
		return nil, fmt.Errorf("admission: swarm key %s (the private key file, not .pub): %w", path, err)
	}
	return k, nil
}

// ReadSwarmPublicKey reads the public half written by NewSwarmKey.
func ReadSwarmPublicKey(path string) (crypto.PubKey, error) {
	b, err := keyfile.Read(path, false)
	if err != nil {
		return nil, fmt.Errorf("admission: swarm public key: %w", err)
	}
	k, err := DecodePublicKeyText(string(b))
	if err != nil {
		return nil, fmt.Errorf("admission: swarm public key %s: %w", path, err)
	}
	return k, nil
}

// ReadMemberToken reads a token written as MemberToken.EncodeText.
func ReadMemberToken(path string) (*MemberToken, error) {
	b, err := keyfile.Read(path, false)
	if err != nil {
		return nil, fmt.Errorf("admission: member token: %w", err)
	}
	t, err := DecodeMemberTokenText(string(b))
	if err != nil {
		return nil, fmt.Errorf("admission: member token %s: %w", path, err)
	}
	return t, nil
}

// WriteMemberToken writes t to a new file at path.
func WriteMemberToken(path string, t *MemberToken) error {
	if err := keyfile.Write(path, []byte(t.EncodeText()), 0o644); err != nil {
		return fmt.Errorf("admission: member token: %w", err)
	}
	return nil
}
