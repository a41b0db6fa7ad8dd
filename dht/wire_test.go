package dht

import (
	"bytes"
	"reflect"
	"testing"

	"github.com/libp2p/go-libp2p/core/peer"
	ma "github.com/multiformats/go-multiaddr"
)

func sampleMessages(t testing.TB) ([]*request, []*response) {
	_, id1 := newIdentity(t)
	_, id2 := newIdentity(t)
	a1 := ma.StringCast("/ip4/127.0.0.1/tcp/4001")
	a2 := ma.StringCast("/ip6/::1/udp/4001/quic-v1")
	target := make([]byte, targetLen)
	target[0] = 7
	reqs := []*request{
		{Type: msgPing},
		{Type: msgPing, Client: true},
		{Type: msgFindNode, Addrs: []ma.Multiaddr{a1, a2}, Target: target},
		{Type: msgFindValue, Addrs: []ma.Multiaddr{a1}, Key: "expert.0.1"},
		{Type: msgStore, Cache: true, Entries: []*entry{
			{Key: "k", Subkey: "", Value: []byte("v"), Expiration: 123},
			{Key: "k" + OwnerMarker(id1), Subkey: "s", Value: []byte{}, Expiration: -5, Signature: []byte("sig")},
		}},
	}
	resps := []*response{
		{Type: msgPing},
		{Type: msgStore, Accepted: []bool{true, false, true}},
		{Type: msgFindNode, Peers: []peer.AddrInfo{{ID: id1, Addrs: []ma.Multiaddr{a1}}, {ID: id2}}},
		{Type: msgFindValue, Items: []*entry{{Subkey: "x", Value: []byte("val"), Expiration: 99, Signature: []byte{1, 2}}}, Peers: []peer.AddrInfo{{ID: id2, Addrs: []ma.Multiaddr{a2, a1}}}},
		{Type: msgFindValue},
	}
	return reqs, resps
}

// normalize makes decoded and original messages comparable (nil vs empty).
func normalizeReq(r *request) *request {
	c := *r
	if len(c.Addrs) == 0 {
		c.Addrs = nil
	}
	for i, e := range c.Entries {
		x := *e
		if len(x.Value) == 0 {
			x.Value = nil
		}
		if len(x.Signature) == 0 {
			x.Signature = nil
		}
		c.Entries[i] = &x
	}
	return &c
}

func TestWireRoundTrip(t *testing.T) {
	reqs, resps := sampleMessages(t)
	for _, r := range reqs {
		b, err := encodeRequest(r)
		if err != nil {
			t.Fatalf("encode %s: %v", r.Type, err)
		}
		got, err := decodeRequest(b)
		if err != nil {
			t.Fatalf("decode %s: %v", r.Type, err)
		}
		b2, _ := encodeRequest(got)
		if !bytes.Equal(b, b2) {
			t.Fatalf("%s: re-encoding differs", r.Type)
		}
		if !reflect.DeepEqual(normalizeReq(got).Entries, normalizeReq(r).Entries) || got.Key != r.Key || !bytes.Equal(got.Target, r.Target) || got.Client != r.Client || got.Cache != r.Cache || len(got.Addrs) != len(r.Addrs) {
			t.Fatalf("%s: got %+v want %+v", r.Type, got, r)
		}
		// Every strict prefix is rejected, and so are trailing bytes.
		for i := 0; i < len(b); i++ {
			if _, err := decodeRequest(b[:i]); err == nil {
				t.Fatalf("%s: prefix of %d/%d bytes accepted", r.Type, i, len(b))
			}
		}
		if _, err := decodeRequest(append(b, 0)); err == nil {
			t.Fatalf("%s: trailing byte accepted", r.Type)
		}
	}
	for _, r := range resps {
		b, err := encodeResponse(r)
		if err != nil {
			t.Fatalf("encode %s: %v", r.Type, err)
		}
		got, err := decodeResponse(b)
		if err != nil {
			t.Fatalf("decode %s: %v", r.Type, err)
		}
		b2, _ := encodeResponse(got)
		if !bytes.Equal(b, b2) {
			t.Fatalf("%s: re-encoding differs", r.Type)
		}
		if len(got.Peers) != len(r.Peers) || len(got.Items) != len(r.Items) || !reflect.DeepEqual(got.Accepted, r.Accepted) {
			t.Fatalf("%s: got %+v want %+v", r.Type, got, r)
		}
		for i := range r.Peers {
			if got.Peers[i].ID != r.Peers[i].ID || len(got.Peers[i].Addrs) != len(r.Peers[i].Addrs) {
				t.Fatalf("peer %d: %v vs %v", i, got.Peers[i], r.Peers[i])
			}
		}
		for i := 0; i < len(b); i++ {
			if _, err := decodeResponse(b[:i]); err == nil {
				t.Fatalf("%s: prefix of %d/%d bytes accepted", r.Type, i, len(b))
			}
		}
	}
}

func TestWireRejectsHostile(t *testing.T) {
	cases := map[string][]byte{
		"empty":        {},
		"version":      {9, 1, 0, 0},
		"type":         {1, 99, 0, 0},
		"flags":        {1, 1, 0x80, 0},
		"addr count":   {1, 1, 0, 200},
		"bad addr":     {1, 1, 0, 1, 0, 2, 0xff, 0xff},
		"huge entries": {1, 2, 0, 0, 0, 0xff, 0xff},
		"huge value":   append([]byte{1, 2, 0, 0, 0, 0, 1, 0, 1, 'k', 0, 0}, 0xff, 0xff, 0xff, 0xff),
		"short target": {1, 3, 0, 0, 1, 2, 3},
		"long key":     {1, 4, 0, 0, 0xff, 0xff},
	}
	for name, b := range cases {
		if _, err := decodeRequest(b); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	bad := map[string][]byte{
		"peer count":   {1, 3, 200},
		"peer id":      {1, 3, 1, 3, 1, 2, 3, 0},
		"store result": {1, 2, 0, 1, 7},
	}
	for name, b := range bad {
		if _, err := decodeResponse(b); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	// Oversized fields are refused when encoding too.
	if _, err := encodeRequest(&request{Type: msgFindValue, Key: string(make([]byte, MaxKeyLen+1))}); err == nil {
		t.Error("oversized key encoded")
	}
	if _, err := encodeRequest(&request{Type: msgStore, Entries: []*entry{{Key: "k", Value: make([]byte, MaxValueLen+1)}}}); err == nil {
		t.Error("oversized value encoded")
	}
}

func fuzzSeeds(f *testing.F, req bool) {
	reqs, resps := sampleMessages(f)
	if req {
		for _, r := range reqs {
			b, _ := encodeRequest(r)
			f.Add(b)
		}
		return
	}
	for _, r := range resps {
		b, _ := encodeResponse(r)
		f.Add(b)
	}
}

func FuzzDecodeRequest(f *testing.F) {
	fuzzSeeds(f, true)
	f.Fuzz(func(t *testing.T, data []byte) {
		r, err := decodeRequest(data)
		if err != nil {
			return
		}
		b, err := encodeRequest(r)
		if err != nil {
			t.Fatalf("decoded request does not re-encode: %v", err)
		}
		r2, err := decodeRequest(b)
		if err != nil {
			t.Fatalf("re-encoded request does not decode: %v", err)
		}
		b2, _ := encodeRequest(r2)
		if !bytes.Equal(b, b2) {
			t.Fatal("encoding not stable")
		}
	})
}

func FuzzDecodeResponse(f *testing.F) {
	fuzzSeeds(f, false)
	f.Fuzz(func(t *testing.T, data []byte) {
		r, err := decodeResponse(data)
		if err != nil {
			return
		}
		b, err := encodeResponse(r)
		if err != nil {
			t.Fatalf("decoded response does not re-encode: %v", err)
		}
		r2, err := decodeResponse(b)
		if err != nil {
			t.Fatalf("re-encoded response does not decode: %v", err)
		}
		b2, _ := encodeResponse(r2)
		if !bytes.Equal(b, b2) {
			t.Fatal("encoding not stable")
		}
	})
}
