package dht

import (
	"crypto/rand"
	"errors"
	"testing"

	"github.com/libp2p/go-libp2p/core/crypto"
	"github.com/libp2p/go-libp2p/core/peer"
)

func newIdentity(t testing.TB) (crypto.PrivKey, peer.ID) {
	t.Helper()
	priv, _, err := crypto.GenerateEd25519Key(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	id, err := peer.IDFromPrivateKey(priv)
	if err != nil {
		t.Fatal(err)
	}
	return priv, id
}

func TestSignedRecords(t *testing.T) {
	priv, id := newIdentity(t)
	evilPriv, evil := newIdentity(t)

	e := ent("expert.1"+OwnerMarker(id), "", "v", 100)
	if err := validateSignature(e); !errors.Is(err, ErrBadSignature) {
		t.Fatalf("unsigned owned record accepted: %v", err)
	}
	if err := sign(e, id, priv); err != nil {
		t.Fatal(err)
	}
	if err := validateSignature(e); err != nil {
		t.Fatalf("valid signature rejected: %v", err)
	}
	// Any change to the signed fields breaks the signature.
	for _, mut := range []func(*entry){
		func(e *entry) { e.Value = []byte("w") },
		func(e *entry) { e.Expiration++ },
		func(e *entry) { e.Subkey = "s" },
	} {
		c := *e
		mut(&c)
		if err := validateSignature(&c); !errors.Is(err, ErrBadSignature) {
			t.Fatalf("tampered record accepted: %v", err)
		}
	}
	// Someone else cannot sign for the owner.
	forged := ent(e.Key, "", "evil", 200)
	if err := sign(forged, evil, evilPriv); !errors.Is(err, ErrNotOwner) {
		t.Fatalf("signed another's record: %v", err)
	}
	forged.Signature, _ = evilPriv.Sign(signedBytes(forged))
	if err := validateSignature(forged); !errors.Is(err, ErrBadSignature) {
		t.Fatalf("forged record accepted: %v", err)
	}
	// Owner in the subkey.
	s := ent("group", OwnerMarker(id), "v", 100)
	if err := sign(s, id, priv); err != nil || validateSignature(s) != nil {
		t.Fatalf("subkey owner: %v / %v", err, validateSignature(s))
	}
	// Unowned records carry no signature.
	u := ent("plain", "", "v", 100)
	if err := sign(u, id, priv); err != nil || u.Signature != nil || validateSignature(u) != nil {
		t.Fatal("unowned record handling")
	}
	u.Signature = []byte("x")
	if validateSignature(u) == nil {
		t.Fatal("signature on unowned record accepted")
	}
	// Malformed and conflicting markers.
	for _, k := range []string{"[owner:notapeer]", "[owner:" + id.String(), OwnerMarker(id) + OwnerMarker(evil)} {
		if _, _, err := owner(k, ""); err == nil {
			t.Fatalf("owner(%q) accepted", k)
		}
	}
}
