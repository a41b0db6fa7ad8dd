package moe

import (
	"errors"
	"math"
	"slices"
	"strings"
	"testing"

	"github.com/libp2p/go-libp2p/core/peer"
	ma "github.com/multiformats/go-multiaddr"

	"github.com/skyhive/skyhive/tensor"
	"github.com/skyhive/skyhive/wire"
)

func TestParseExperts(t *testing.T) {
	got, err := ParseExperts("ffn.[0:2].[1:3], ffn.5.0,ffn.0.1", 100)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"ffn.0.1", "ffn.0.2", "ffn.1.1", "ffn.1.2", "ffn.5.0"}
	if !slices.Equal(got, want) {
		t.Fatalf("got %v, want %v", got, want)
	}
	for _, bad := range []string{"", "ffn", ".1", "ffn.[2:1]", "ffn.01", "ffn.x", "ffn.[0:5", "a.b.[0:3]"} {
		if _, err := ParseExperts(bad, 100); !errors.Is(err, ErrUID) {
			t.Errorf("ParseExperts(%q) = %v, want ErrUID", bad, err)
		}
	}
	if _, err := ParseExperts("ffn.[0:100].[0:100]", 1000); !errors.Is(err, ErrUID) {
		t.Errorf("expected the expert limit to apply, got %v", err)
	}
}

func TestRecordsAndGrid(t *testing.T) {
	rs, err := Records("ffn.3.7")
	if err != nil {
		t.Fatal(err)
	}
	want := []Record{{"ffn.3.7", ""}, {"ffn.", "3"}, {"ffn.3.", "7"}}
	if !slices.Equal(rs, want) {
		t.Fatalf("got %v, want %v", rs, want)
	}
	g := Grid{Prefix: "ffn", Size: []int{2, 3}}
	if err := g.Validate(); err != nil {
		t.Fatal(err)
	}
	uids := g.UIDs()
	if len(uids) != 6 || uids[0] != "ffn.0.0" || uids[5] != "ffn.1.2" || g.TotalSize() != 5 {
		t.Fatalf("grid uids %v", uids)
	}
	if (Grid{Prefix: "a.b", Size: []int{2}}).Validate() == nil {
		t.Fatal("dotted prefix accepted")
	}
}

func TestInfoRoundTrip(t *testing.T) {
	id, err := peer.Decode("12D3KooWD3eckifWpRn9wQpMG9R9hX3sD158z7EqHWmweQAJU5SA")
	if err != nil {
		t.Fatal(err)
	}
	a := ma.StringCast("/ip4/127.0.0.1/tcp/4001")
	in := ExpertInfo{UID: "ffn.1.2", Peer: peer.AddrInfo{ID: id, Addrs: []ma.Multiaddr{a}}}
	b, err := MarshalInfo(in)
	if err != nil {
		t.Fatal(err)
	}
	out, err := UnmarshalInfo(b)
	if err != nil {
		t.Fatal(err)
	}
	if out.UID != in.UID || out.Peer.ID != id || len(out.Peer.Addrs) != 1 || !out.Peer.Addrs[0].Equal(a) {
		t.Fatalf("round trip: %+v", out)
	}
	if _, err := UnmarshalInfo([]byte(`{"uid":"bad","peer":{"ID":"x"}}`)); err == nil {
		t.Fatal("bad uid accepted")
	}
}

// TestInfoSpec checks that an expert's declared type and hidden size
// survive the DHT record and that out-of-bounds ones are refused on both
// sides.
func TestInfoSpec(t *testing.T) {
	id, err := peer.Decode("12D3KooWD3eckifWpRn9wQpMG9R9hX3sD158z7EqHWmweQAJU5SA")
	if err != nil {
		t.Fatal(err)
	}
	in := ExpertInfo{UID: "ffn.1.2", Peer: peer.AddrInfo{ID: id}, Type: "ffn", Hidden: 1024}
	b, err := MarshalInfo(in)
	if err != nil {
		t.Fatal(err)
	}
	out, err := UnmarshalInfo(b)
	if err != nil || out.Type != "ffn" || out.Hidden != 1024 {
		t.Fatalf("round trip: %+v, %v", out, err)
	}
	for _, bad := range []ExpertInfo{
		{UID: "ffn.1", Peer: in.Peer, Hidden: -1},
		{UID: "ffn.1", Peer: in.Peer, Hidden: MaxHidden + 1},
		{UID: "ffn.1", Peer: in.Peer, Type: "FFN\n"},
		{UID: "ffn.1", Peer: in.Peer, Type: strings.Repeat("a", 33)},
	} {
		if _, err := MarshalInfo(bad); err == nil {
			t.Errorf("MarshalInfo accepted %+v", bad)
		}
	}
	for _, raw := range []string{
		`{"uid":"ffn.1","peer":{"ID":"12D3KooWD3eckifWpRn9wQpMG9R9hX3sD158z7EqHWmweQAJU5SA"},"hidden":99999999}`,
		`{"uid":"ffn.1","peer":{"ID":"12D3KooWD3eckifWpRn9wQpMG9R9hX3sD158z7EqHWmweQAJU5SA"},"type":"<b>"}`,
	} {
		if e, err := UnmarshalInfo([]byte(raw)); !errors.Is(err, ErrRequest) {
			t.Errorf("UnmarshalInfo(%s) = %+v, %v; want ErrRequest", raw, e, err)
		}
	}
}

func TestRequestRoundTrip(t *testing.T) {
	x := tensor.FromSlice([]float32{1, 2, 3, 4, 5, 6}, 2, 3)
	b, err := EncodeRequest("ffn.0.1", []wire.Named{{Name: "x", Tensor: x}}, wire.Options{})
	if err != nil {
		t.Fatal(err)
	}
	uid, msg, err := DecodeRequest(b, wire.Limits{MaxElements: 6})
	if err != nil {
		t.Fatal(err)
	}
	got := wire.Get(msg, "x")
	if uid != "ffn.0.1" || got == nil || !slices.Equal(got.Data, x.Data) {
		t.Fatalf("round trip: %q %v", uid, msg)
	}
	if _, _, err := DecodeRequest(b, wire.Limits{MaxElements: 5}); !errors.Is(err, wire.ErrLimit) {
		t.Fatalf("oversized tensor: %v, want ErrLimit", err)
	}
	if _, _, err := DecodeRequest(b[:len(b)-1], wire.Limits{}); !errors.Is(err, ErrRequest) {
		t.Fatalf("truncated: %v", err)
	}
}

func FuzzUnmarshalInfo(f *testing.F) {
	f.Add([]byte(`{"uid":"ffn.1.2","peer":{"ID":"12D3KooWD3eckifWpRn9wQpMG9R9hX3sD158z7EqHWmweQAJU5SA","Addrs":["/ip4/127.0.0.1/tcp/1"]}}`))
	f.Add([]byte(`{}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		e, err := UnmarshalInfo(b)
		if err != nil {
			return
		}
		if _, err := MarshalInfo(e); err != nil {
			t.Fatalf("valid info does not re-encode: %v", err)
		}
	})
}

// FuzzDecodeRequest checks that DecodeRequest never panics, never returns
// more than its limits allow, and that what it accepts re-encodes to a
// request that decodes to the same tensors.
func FuzzDecodeRequest(f *testing.F) {
	lim := wire.Limits{MaxElements: 256, MaxDims: 3, MaxTensors: 2}
	x := tensor.New(2, 3)
	for i := range x.Data {
		x.Data[i] = float32(i) - 2.5
	}
	for _, o := range []wire.Options{{}, {Codec: wire.CodecFP16}, {Codec: wire.CodecUniform8}} {
		req, err := EncodeRequest("ffn.1.2", []wire.Named{{Name: "x", Tensor: x}, {Name: "dy", Tensor: x}}, o)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(req)
		f.Add(req[:len(req)-1])
	}
	f.Add(must(EncodeRequest("", nil, wire.Options{})))
	f.Add([]byte("SKX\x01\xff"))
	f.Fuzz(func(t *testing.T, b []byte) {
		uid, msg, err := DecodeRequest(b, lim)
		if err != nil {
			if !errors.Is(err, ErrRequest) {
				t.Fatalf("error %v does not wrap ErrRequest", err)
			}
			return
		}
		if len(uid) > MaxUIDLen || len(msg) > lim.MaxTensors {
			t.Fatalf("uid of %d bytes, %d tensors", len(uid), len(msg))
		}
		total := 0
		for _, m := range msg {
			if len(m.Tensor.Shape) > lim.MaxDims {
				t.Fatalf("tensor %q of rank %d", m.Name, len(m.Tensor.Shape))
			}
			total += m.Tensor.Len()
		}
		if total > lim.MaxElements {
			t.Fatalf("%d elements decoded, limit %d", total, lim.MaxElements)
		}
		again, err := EncodeRequest(uid, msg, wire.Options{})
		if err != nil {
			t.Fatalf("re-encode: %v", err)
		}
		uid2, msg2, err := DecodeRequest(again, lim)
		if err != nil || uid2 != uid || len(msg2) != len(msg) {
			t.Fatalf("round trip: %v", err)
		}
		for i := range msg {
			a, b := msg[i].Tensor, msg2[i].Tensor
			if msg[i].Name != msg2[i].Name || !slices.Equal(a.Shape, b.Shape) || len(a.Data) != len(b.Data) {
				t.Fatalf("round trip changed tensor %q", msg[i].Name)
			}
			for j := range a.Data {
				if math.Float32bits(a.Data[j]) != math.Float32bits(b.Data[j]) {
					t.Fatalf("round trip changed %q[%d]", msg[i].Name, j)
				}
			}
		}
	})
}

func must(b []byte, err error) []byte {
	if err != nil {
		panic(err)
	}
	return b
}
