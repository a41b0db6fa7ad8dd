package dialback

import (
	"context"
	"net"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/skyhive/skyhive/p2p"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// A peer dials the caller's TCP address back; a closed port fails, and an
// address on another IP is refused without a dial.
func TestDialback(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	loop := p2p.Config{ListenAddrs: []string{"/ip4/127.0.0.1/tcp/0"}}
	srv, err := p2p.New(ctx, loop)
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	Serve(srv)
	cli, err := p2p.New(ctx, loop)
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := "/ip4/127.0.0.1/tcp/" + strings.TrimPrefix(ln.Addr().String(), "127.0.0.1:")
	ln.Close()
	own := cli.Reach().Addrs[0]
	addrs := []string{own, closed, "/ip4/10.1.2.3/tcp/4001", "/ip4/127.0.0.1/udp/4001/quic-v1", "nonsense"}
	res, err := Ask(ctx, cli, srv.AddrInfo(), addrs)
	if err != nil {
		t.Fatal(err)
	}
	if len(res) != len(addrs) {
		t.Fatalf("%d results for %d addresses", len(res), len(addrs))
	}
	want := []struct {
		ok  bool
		err string
	}{{true, ""}, {false, "refused"}, {false, "not the address"}, {false, "not a TCP"}, {false, "not a multiaddr"}}
	for i, w := range want {
		if res[i].OK != w.ok || !strings.Contains(res[i].Error, w.err) {
			t.Errorf("%s: %+v, want ok=%v and %q", addrs[i], res[i], w.ok, w.err)
		}
	}
	if _, err := Ask(ctx, cli, srv.AddrInfo(), make([]string, MaxAddrs+1)); err == nil {
		t.Error("too many addresses accepted")
	}
}

func FuzzDialbackRequest(f *testing.F) {
	f.Add([]byte(`{"addrs":["/ip4/127.0.0.1/tcp/1"]}`))
	f.Add([]byte(`{"addrs":null}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		r, err := parseRequest(b)
		if err == nil && len(r.Addrs) > MaxAddrs {
			t.Fatalf("%d addresses accepted", len(r.Addrs))
		}
		for _, a := range r.Addrs {
			if res := dialBack(context.Background(), a, nil); res.OK {
				t.Fatalf("%q dialled without a caller IP", a)
			}
		}
	})
}
