package blocklist

import (
	"crypto/rand"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/crypto"
	"github.com/libp2p/go-libp2p/core/peer"
)

func TestBlockTableBounded(t *testing.T) {
	self, _ := newTestID(0)
	l := New(self, Options{})
	for i := range maxBlocked + 100 {
		id, _ := newTestID(i)
		l.Block(id, time.Duration(i+1)*time.Minute)
	}
	l.mu.Lock()
	n := len(l.blocked)
	l.mu.Unlock()
	if n > maxBlocked {
		t.Fatalf("%d blocks held, at most %d", n, maxBlocked)
	}
}

// newTestID returns a fresh peer ID (i only names the call).
func newTestID(int) (peer.ID, error) {
	_, pub, err := crypto.GenerateEd25519Key(rand.Reader)
	if err != nil {
		return "", err
	}
	return peer.IDFromPublicKey(pub)
}
