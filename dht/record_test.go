package dht

import (
	"bytes"
	"errors"
	"testing"
)

func ent(key, sub, val string, exp int64) *entry {
	return &entry{Key: key, Subkey: sub, Value: []byte(val), Expiration: exp}
}

func itemsOf(es []*entry) map[string]string {
	m := make(map[string]string)
	for _, e := range es {
		m[e.Subkey] = string(e.Value)
	}
	return m
}

func TestStoragePlainLatestWins(t *testing.T) {
	s := newStorage(10)
	if err := s.put(ent("k", "", "a", 100), 0); err != nil {
		t.Fatal(err)
	}
	if err := s.put(ent("k", "", "old", 50), 0); !errors.Is(err, ErrStale) {
		t.Fatalf("older value accepted: %v", err)
	}
	if err := s.put(ent("k", "", "b", 200), 0); err != nil {
		t.Fatal(err)
	}
	if got := itemsOf(s.get("k", 0)); got[""] != "b" || len(got) != 1 {
		t.Fatalf("got %v", got)
	}
	// Equal expirations: the tie-break is the same on every replica.
	_ = s.put(ent("k", "", "a", 200), 0)
	_ = s.put(ent("k", "", "c", 200), 0)
	if got := itemsOf(s.get("k", 0)); got[""] != "c" {
		t.Fatalf("tie-break: got %v", got)
	}
	if err := s.put(ent("k", "", "x", 5), 10); !errors.Is(err, ErrExpired) {
		t.Fatalf("expired accepted: %v", err)
	}
}

func TestStorageSubkeys(t *testing.T) {
	s := newStorage(100)
	mustPut := func(e *entry) {
		t.Helper()
		if err := s.put(e, 0); err != nil {
			t.Fatalf("put %+v: %v", e, err)
		}
	}
	mustPut(ent("k", "a", "1", 100))
	mustPut(ent("k", "b", "2", 150))
	mustPut(ent("k", "a", "3", 120))
	if err := s.put(ent("k", "b", "old", 140), 0); !errors.Is(err, ErrStale) {
		t.Fatalf("stale subkey accepted: %v", err)
	}
	if got := itemsOf(s.get("k", 0)); got["a"] != "3" || got["b"] != "2" || len(got) != 2 {
		t.Fatalf("got %v", got)
	}
	// A plain value never replaces a live dictionary, however late it
	// expires (the erase-the-dictionary attack).
	if err := s.put(ent("k", "", "p", 1<<40), 0); !errors.Is(err, ErrDictionary) {
		t.Fatalf("plain replaced a live dictionary: %v", err)
	}
	if got := itemsOf(s.get("k", 0)); got["a"] != "3" || got["b"] != "2" || len(got) != 2 {
		t.Fatalf("dictionary changed: %v", got)
	}
	// Once every subkey expired, a plain value may take the key.
	if err := s.put(ent("k", "", "p", 200), 160); err != nil {
		t.Fatal(err)
	}
	if got := itemsOf(s.get("k", 160)); got[""] != "p" || len(got) != 1 || s.Len() != 1 {
		t.Fatalf("got %v len %d", got, s.Len())
	}
	// A subkey always replaces a plain value, even one expiring later.
	mustPut(ent("k", "z", "1", 180))
	if got := itemsOf(s.get("k", 0)); got["z"] != "1" || len(got) != 1 || s.Len() != 1 {
		t.Fatalf("got %v len %d", got, s.Len())
	}
	// Merging replicas in either order keeps the dictionary.
	for _, sets := range [][2][]*entry{
		{{ent("m", "", "plain", 900)}, {ent("m", "x", "1", 100)}},
		{{ent("m", "x", "1", 100)}, {ent("m", "", "plain", 900)}},
	} {
		if got := itemsOf(merge(0, sets[0], sets[1])); len(got) != 1 || got["x"] != "1" {
			t.Fatalf("merge %v", got)
		}
	}
}

func TestStorageExpiryAndBound(t *testing.T) {
	s := newStorage(3)
	for i, exp := range []int64{10, 20, 30} {
		if err := s.put(ent(string(rune('a'+i)), "", "v", exp), 0); err != nil {
			t.Fatal(err)
		}
	}
	// Full: the item expiring first (a@10) makes room for a later one.
	if err := s.put(ent("d", "", "v", 40), 0); err != nil {
		t.Fatal(err)
	}
	if s.get("a", 0) != nil || s.Len() != 3 {
		t.Fatalf("a not evicted, len %d", s.Len())
	}
	// A newcomer expiring before everything stored is refused.
	if err := s.put(ent("e", "", "v", 15), 0); err == nil {
		t.Fatal("early-expiring item evicted a later one")
	}
	if got := s.get("b", 25); got != nil {
		t.Fatalf("expired item returned: %v", got)
	}
	s.cleanup(35)
	if s.Len() != 1 || s.get("d", 35) == nil {
		t.Fatalf("after cleanup len %d", s.Len())
	}
	// Replacing many times keeps the heap compact.
	for i := int64(0); i < 10000; i++ {
		_ = s.put(ent("d", "", "v", 100+i), 0)
	}
	if s.exp.Len() > 2*s.Len()+1024 {
		t.Fatalf("heap holds %d refs for %d items", s.exp.Len(), s.Len())
	}
}

func TestMergeFreshestPerSubkey(t *testing.T) {
	a := []*entry{ent("k", "x", "a1", 100), ent("k", "y", "a2", 100)}
	b := []*entry{ent("k", "x", "b1", 200), ent("k", "z", "b3", 50)}
	got := itemsOf(merge(0, a, b))
	want := map[string]string{"x": "b1", "y": "a2", "z": "b3"}
	for k, v := range want {
		if got[k] != v {
			t.Fatalf("merge: got %v want %v", got, want)
		}
	}
	if got := merge(60, b); len(got) != 1 || !bytes.Equal(got[0].Value, []byte("b1")) {
		t.Fatalf("merge kept expired items: %v", itemsOf(got))
	}
}
