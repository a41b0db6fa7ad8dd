package p2p

import "testing"

// BenchmarkCallTCP is a 64-byte call's round trip over TCP+TLS on
// loopback.
func BenchmarkCallTCP(b *testing.B) {
	a, srv := pair(b, "tcp", Config{}, Config{})
	defer a.Close()
	defer srv.Close()
	ctx := b.Context()
	req := make([]byte, 64)
	if _, err := a.Call(ctx, srv.AddrInfo(), echoProto, req); err != nil {
		b.Fatal(err)
	}
	for b.Loop() {
		if _, err := a.Call(ctx, srv.AddrInfo(), echoProto, req); err != nil {
			b.Fatal(err)
		}
	}
}
