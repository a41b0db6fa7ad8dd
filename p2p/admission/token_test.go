package admission

import (
	"bytes"
	"crypto/rand"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/crypto"
	"github.com/libp2p/go-libp2p/core/peer"
)

func FuzzMemberToken(f *testing.F) {
	priv, pub, _ := crypto.GenerateEd25519Key(rand.Reader)
	id, _ := peer.IDFromPrivateKey(priv)
	tok, _ := NewMemberToken(priv, id, time.Unix(1<<33, 0))
	f.Add(tok.Marshal())
	f.Add([]byte{})
	f.Add([]byte{0, 1, 2})
	f.Fuzz(func(t *testing.T, b []byte) {
		tk, err := UnmarshalMemberToken(b)
		if err != nil {
			return
		}
		if !bytes.Equal(tk.Marshal(), b) {
			t.Fatalf("round trip changed the token")
		}
		// Only the genuine token verifies.
		if tk.Verify(pub, tk.Peer, time.Unix(0, 0)) == nil && !bytes.Equal(b, tok.Marshal()) {
			t.Fatalf("a mutated token verified")
		}
		adm := &Config{SwarmKey: pub, Token: tok}
		adm.verify(append([]byte{proofToken}, b...), tk.Peer, id, time.Unix(0, 0))
	})
}
