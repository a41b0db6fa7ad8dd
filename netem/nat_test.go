package netem

import (
	"encoding/binary"
	"net/netip"
	"testing"
	"time"
)

// packet builds a minimal IPv4 TCP (6) or UDP (17) header from src to dst.
func packet(proto uint8, src, dst string) []byte {
	s, d := netip.MustParseAddrPort(src), netip.MustParseAddrPort(dst)
	p := make([]byte, 40)
	p[0] = 0x45
	p[9] = proto
	copy(p[12:16], s.Addr().AsSlice())
	copy(p[16:20], d.Addr().AsSlice())
	binary.BigEndian.PutUint16(p[20:22], s.Port())
	binary.BigEndian.PutUint16(p[22:24], d.Port())
	return p
}

func TestNATFilter(t *testing.T) {
	f := newNATFilter()
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	const in, out = "10.77.0.2:40000", "10.77.0.1:4001"
	// Nothing gets in unasked.
	if f.inbound(packet(6, out, in), now) {
		t.Fatal("unsolicited TCP let in")
	}
	// The inside peer opens a flow: replies on it get in, others do not.
	f.outbound(packet(6, in, out), now)
	cases := []struct {
		pkt  []byte
		want bool
	}{
		{packet(6, out, in), true},
		{packet(17, out, in), false},                      // other protocol
		{packet(6, "10.77.0.3:4001", in), false},          // other remote host
		{packet(6, "10.77.0.1:4002", in), false},          // other remote port
		{packet(6, out, "10.77.0.2:40001"), false},        // other local port
		{append(packet(6, out, in)[:20:20], 0, 0), false}, // runt
	}
	for i, c := range cases {
		if got := f.inbound(c.pkt, now.Add(time.Second)); got != c.want {
			t.Errorf("case %d: inbound = %v, want %v", i, got, c.want)
		}
	}
	// The flow expires without outbound traffic.
	if f.inbound(packet(6, out, in), now.Add(natFlowTTL+time.Second)) {
		t.Error("expired flow let in")
	}
	// Fragments and non-IPv4 are refused.
	frag := packet(17, out, in)
	binary.BigEndian.PutUint16(frag[6:8], 5)
	f.outbound(packet(17, in, out), now)
	if f.inbound(frag, now) {
		t.Error("fragment let in")
	}
	if f.inbound([]byte{0x60, 0, 0}, now) {
		t.Error("IPv6 runt let in")
	}
}

func FuzzNATFilter(f *testing.F) {
	f.Add(packet(6, "10.77.0.1:1", "10.77.0.2:2"))
	f.Fuzz(func(t *testing.T, b []byte) {
		nf := newNATFilter()
		now := time.Unix(0, 0)
		if nf.inbound(b, now) {
			t.Fatal("a packet got in with no flow open")
		}
		nf.outbound(b, now)
	})
}
