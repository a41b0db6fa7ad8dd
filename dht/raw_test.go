package dht

import (
	"testing"
	"time"
)

// TestRawRequests sends hand-made requests through the exported encoders:
// a node accepts a signed subkey record and a plain value within MaxTTL,
// and refuses a far-future record, another writer's subkey and a plain
// value over the dictionary; FIND_VALUE returns what it holds.
func TestRawRequests(t *testing.T) {
	s := newSwarm(t, 2, Config{})
	ctx := ctxT(t)
	to := s.peers[1].AddrInfo()
	now := time.Now()
	store := func(from int, recs ...RawRecord) []bool {
		t.Helper()
		req, err := EncodeStore(recs, s.peers[from].PrivKey(), true)
		if err != nil {
			t.Fatal(err)
		}
		raw, err := s.peers[from].Call(ctx, to, ProtocolID, req)
		if err != nil {
			t.Fatal(err)
		}
		ok, err := DecodeStoreResponse(raw)
		if err != nil {
			t.Fatal(err)
		}
		return ok
	}
	got := store(0,
		RawRecord{Key: "ffn.", Subkey: "0", Value: []byte("mine"), Expiration: now.Add(time.Hour)},
		RawRecord{Key: "plain", Value: []byte("v"), Expiration: now.Add(time.Hour)},
		RawRecord{Key: "future", Value: []byte("v"), Expiration: now.Add(30 * 24 * time.Hour)},
	)
	if !got[0] || !got[1] || got[2] {
		t.Fatalf("accepted %v, want [true true false]", got)
	}
	s.add()
	if got := store(2, RawRecord{Key: "ffn.", Subkey: "0", Value: []byte("theirs"), Expiration: now.Add(2 * time.Hour)},
		RawRecord{Key: "ffn.", Value: []byte("erased"), Expiration: now.Add(2 * time.Hour)}); got[0] || got[1] {
		t.Fatalf("another writer's subkey or an erasure accepted: %v", got)
	}
	req, err := EncodeFindValue("ffn.")
	if err != nil {
		t.Fatal(err)
	}
	raw, err := s.peers[0].Call(ctx, to, ProtocolID, req)
	if err != nil {
		t.Fatal(err)
	}
	recs, err := DecodeFindValueResponse("ffn.", raw)
	if err != nil || len(recs) != 1 || string(recs[0].Value) != "mine" || len(recs[0].Signature) == 0 {
		t.Fatalf("FIND_VALUE: %+v %v", recs, err)
	}
	if _, err := DecodeStoreResponse(raw); err == nil {
		t.Fatal("a FIND_VALUE answer decoded as a STORE answer")
	}
}
