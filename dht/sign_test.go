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

// TestWriterSignatures checks subkey items signed by their writer and the
// implicit ownership of peer-ID subkeys.
func TestWriterSignatures(t *testing.T) {
	priv, id := newIdentity(t)
	evilPriv, evil := newIdentity(t)
	e := ent("ffn.", "3", "v", 100)
	if err := sign(e, id, priv); err != nil || e.writer != string(id) {
		t.Fatalf("sign: %v writer %q", err, e.writer)
	}
	c := *e
	c.writer = ""
	if err := validateSignature(&c); err != nil || c.writer != string(id) {
		t.Fatalf("validate: %v writer %q", err, c.writer)
	}
	// Tampering, or claiming another writer, breaks it.
	c.Value = []byte("w")
	if validateSignature(&c) == nil {
		t.Fatal("tampered item accepted")
	}
	c = *e
	c.Signature = append([]byte{byte(len(evil))}, append([]byte(evil), e.Signature[1+len(id):]...)...)
	if validateSignature(&c) == nil {
		t.Fatal("item with a swapped writer accepted")
	}
	for _, bad := range [][]byte{{0}, {200, 1}, {3, 1, 2, 3}} {
		c.Signature = bad
		if validateSignature(&c) == nil {
			t.Fatalf("malformed writer %v accepted", bad)
		}
	}
	// The cache of verified signatures binds the whole record and writer.
	var v verified
	for range 2 {
		c = *e
		if err := validateWith(&c, &v); err != nil || c.writer != string(id) {
			t.Fatalf("cached validate: %v", err)
		}
	}
	c.Value = []byte("w")
	if validateWith(&c, &v) == nil {
		t.Fatal("tampered item accepted after its original verified")
	}
	c = *e
	c.Signature = append([]byte{byte(len(evil))}, append([]byte(evil), e.Signature[1+len(id):]...)...)
	if validateWith(&c, &v) == nil {
		t.Fatal("swapped writer accepted after the original verified")
	}
	// A subkey that is a peer ID belongs to that peer.
	p := ent("run/peers", id.String(), "v", 100)
	if err := sign(p, evil, evilPriv); !errors.Is(err, ErrNotOwner) {
		t.Fatalf("signed another peer's subkey: %v", err)
	}
	p.Signature, _ = evilPriv.Sign(signedBytes(p))
	if validateSignature(p) == nil {
		t.Fatal("forged peer-ID subkey accepted")
	}
	if err := sign(p, id, priv); err != nil || validateSignature(p) != nil {
		t.Fatalf("owner's peer-ID subkey: %v", err)
	}
	// The storage keeps a live subkey's writer; a merge does not.
	s := newStorage(10)
	mine, theirs := ent("k", "s", "a", 100), ent("k", "s", "b", 200)
	mine.writer, theirs.writer = string(id), string(evil)
	if err := s.put(mine, 0); err != nil {
		t.Fatal(err)
	}
	if err := s.put(theirs, 0); !errors.Is(err, ErrOwned) {
		t.Fatalf("took over a live subkey: %v", err)
	}
	if err := s.put(theirs, 100); err != nil {
		t.Fatalf("subkey free after expiry: %v", err)
	}
	if got := itemsOf(merge(0, []*entry{mine}, []*entry{theirs})); got["s"] != "b" {
		t.Fatalf("merge %v", got)
	}
	// A reader outvotes a replica serving another writer's far-future copy.
	mine2 := *mine
	mine2.Expiration = 90
	for _, sets := range [][][]*entry{
		{{mine}, {&mine2}, {theirs}},
		{{theirs}, {mine}, {&mine2}},
	} {
		if got := merge(0, sets...); len(got) != 1 || got[0] != mine {
			t.Fatalf("merge picked %v", itemsOf(got))
		}
	}
}
