package admission_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/crypto"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/core/protocol"
	"go.uber.org/goleak"

	"github.com/skyhive/skyhive/p2p"
	"github.com/skyhive/skyhive/p2p/admission"
)

func TestMain(m *testing.M) {
	// A closed Host, with its admission Service, leaves no goroutines.
	goleak.VerifyTestMain(m)
}

const echoProto protocol.ID = "/skyhive/test/echo/1.0.0"

var transports = []string{"tcp", "quic"}

func listenAddr(transport string) string {
	if transport == "quic" {
		return "/ip4/127.0.0.1/udp/0/quic-v1"
	}
	return "/ip4/127.0.0.1/tcp/0"
}

func newHost(t testing.TB, transport string, cfg p2p.Config) *p2p.Host {
	t.Helper()
	cfg.ListenAddrs = []string{listenAddr(transport)}
	h, err := p2p.New(context.Background(), cfg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(func() {
		if err := h.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return h
}

func ctxT(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

var testSecret = []byte("0123456789abcdef0123456789abcdef")

// countingEcho is an echo handler that counts its runs.
func countingEcho(n *atomic.Int64) p2p.Handler {
	return func(_ context.Context, _ peer.ID, req []byte) ([]byte, error) {
		n.Add(1)
		return req, nil
	}
}

// Members of a closed swarm call each other in both directions; a stranger
// (no admission) and a peer with the wrong secret are refused before the
// handler runs, and their connections are closed.
func TestAdmissionSecret(t *testing.T) {
	for _, tr := range transports {
		t.Run(tr, func(t *testing.T) {
			adm := &admission.Config{Secret: testSecret, Timeout: 2 * time.Second}
			a := newHost(t, tr, p2p.Config{Admission: adm})
			b := newHost(t, tr, p2p.Config{Admission: adm})
			var runs atomic.Int64
			a.SetHandler(echoProto, countingEcho(&runs))
			b.SetHandler(echoProto, countingEcho(&runs))
			ctx := ctxT(t, 10*time.Second)
			for _, c := range [][2]*p2p.Host{{a, b}, {b, a}} {
				got, err := c[0].Call(ctx, c[1].AddrInfo(), echoProto, []byte("hi"))
				if err != nil || string(got) != "hi" {
					t.Fatalf("member call: %q, %v", got, err)
				}
			}
			if !a.Admission().Admitted(b.ID()) || !b.Admission().Admitted(a.ID()) {
				t.Error("members not admitted")
			}

			stranger := newHost(t, tr, p2p.Config{})
			_, err := stranger.Call(ctx, a.AddrInfo(), echoProto, []byte("x"))
			var re *p2p.RemoteError
			if !errors.As(err, &re) || !strings.Contains(err.Error(), "not admitted: this swarm is closed") {
				t.Fatalf("a stranger's call: %v", err)
			}
			wrong := newHost(t, tr, p2p.Config{Admission: &admission.Config{Secret: bytes.Repeat([]byte{7}, 32), Timeout: 2 * time.Second}})
			_, err = wrong.Call(ctx, a.AddrInfo(), echoProto, []byte("x"))
			if !errors.Is(err, admission.ErrNotAdmitted) || !strings.Contains(err.Error(), "wrong swarm secret") {
				t.Fatalf("wrong secret: %v", err)
			}
			if n := runs.Load(); n != 2 {
				t.Errorf("handlers ran %d times, want 2 (the members' calls only)", n)
			}
			if a.Admission().Admitted(stranger.ID()) || a.Admission().Admitted(wrong.ID()) {
				t.Error("a stranger is admitted")
			}
			// Both are disconnected: the stranger when its connection went
			// unadmitted for the timeout, the wrong secret after its refusal.
			deadline := time.Now().Add(5 * time.Second)
			for a.NumConns(stranger.ID())+a.NumConns(wrong.ID()) > 0 {
				if time.Now().After(deadline) {
					t.Fatalf("strangers still connected: %d, %d", a.NumConns(stranger.ID()), a.NumConns(wrong.ID()))
				}
				time.Sleep(20 * time.Millisecond)
			}
			// The members still talk.
			if _, err := b.Call(ctx, a.AddrInfo(), echoProto, []byte("again")); err != nil {
				t.Fatalf("member call after the strangers: %v", err)
			}
		})
	}
}

// Member tokens: signed by the swarm key for the bearer's peer ID, not
// expired. A token of another peer, an expired one and one signed by
// another key are refused.
func TestAdmissionTokens(t *testing.T) {
	swarmPriv, swarmPub, err := crypto.GenerateEd25519Key(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	otherPriv, _, _ := crypto.GenerateEd25519Key(rand.Reader)
	ctx := ctxT(t, 20*time.Second)
	dir := t.TempDir()
	member := func(name string, sign crypto.PrivKey, expires time.Time, tokenFor func(peer.ID) peer.ID) p2p.Config {
		path := dir + "/" + name + ".key"
		k, err := p2p.LoadOrCreateIdentity(path)
		if err != nil {
			t.Fatal(err)
		}
		id, _ := peer.IDFromPrivateKey(k)
		if tokenFor != nil {
			id = tokenFor(id)
		}
		tok, err := admission.NewMemberToken(sign, id, expires)
		if err != nil {
			t.Fatal(err)
		}
		return p2p.Config{IdentityFile: path, Admission: &admission.Config{SwarmKey: swarmPub, Token: tok, Timeout: 2 * time.Second}}
	}
	future := time.Now().Add(time.Hour)
	a := newHost(t, "tcp", member("a", swarmPriv, future, nil))
	b := newHost(t, "tcp", member("b", swarmPriv, future, nil))
	var runs atomic.Int64
	a.SetHandler(echoProto, countingEcho(&runs))
	if _, err := b.Call(ctx, a.AddrInfo(), echoProto, []byte("hi")); err != nil {
		t.Fatalf("member call: %v", err)
	}

	// A host refuses to start with a token that is not its own.
	cfg := member("c", swarmPriv, future, func(peer.ID) peer.ID { return a.ID() })
	cfg.ListenAddrs = []string{listenAddr("tcp")}
	if h, err := p2p.New(ctx, cfg); err == nil {
		h.Close()
		t.Fatal("a host started with another peer's token")
	}

	// A member of another swarm (its token signed by another swarm key) is
	// refused on the wire.
	otherPub := otherPriv.GetPublic()
	cfg = member("d", otherPriv, future, nil)
	cfg.Admission.SwarmKey = otherPub
	other := newHost(t, "tcp", cfg)
	_, err = other.Call(ctx, a.AddrInfo(), echoProto, []byte("x"))
	if !errors.Is(err, admission.ErrNotAdmitted) || !strings.Contains(err.Error(), "not a member of this swarm") {
		t.Fatalf("another swarm's member: %v", err)
	}
	if runs.Load() != 1 {
		t.Errorf("handler ran %d times, want 1", runs.Load())
	}
	now := time.Now()
	tok, _ := admission.NewMemberToken(swarmPriv, b.ID(), now.Add(time.Minute))
	if err := tok.Verify(swarmPub, b.ID(), now.Add(2*time.Minute)); err == nil || !strings.Contains(err.Error(), "expired") {
		t.Errorf("expired token: %v", err)
	}
	if err := tok.Verify(swarmPub, a.ID(), now); err == nil {
		t.Error("a token presented by another peer was accepted")
	}
	back, err := admission.DecodeMemberTokenText(tok.EncodeText())
	if err != nil || back.Peer != tok.Peer || !back.Expires.Equal(tok.Expires) || !bytes.Equal(back.Sig, tok.Sig) {
		t.Errorf("text round trip: %+v, %v", back, err)
	}
}

func TestAdmissionConfigErrors(t *testing.T) {
	_, pub, _ := crypto.GenerateEd25519Key(rand.Reader)
	for name, adm := range map[string]*admission.Config{
		"empty":        {},
		"short secret": {Secret: []byte("short")},
		"both":         {Secret: testSecret, SwarmKey: pub},
		"no token":     {SwarmKey: pub},
	} {
		h, err := p2p.New(context.Background(), p2p.Config{ListenAddrs: []string{listenAddr("tcp")}, Admission: adm})
		if err == nil {
			h.Close()
			t.Errorf("%s: accepted", name)
		}
	}
}

// A closed relay grants reservations to members only.
func TestAdmissionRelay(t *testing.T) {
	adm := &admission.Config{Secret: testSecret, Timeout: 2 * time.Second}
	relay := newHost(t, "tcp", p2p.Config{Admission: adm, RelayService: true, Reachability: p2p.ReachabilityPublic})
	ctx := ctxT(t, 30*time.Second)
	cfg := p2p.Config{ListenAddrs: []string{listenAddr("tcp")}, StaticRelays: []peer.AddrInfo{relay.AddrInfo()}, Reachability: p2p.ReachabilityPrivate}
	if h, err := p2p.New(ctx, cfg); err == nil {
		h.Close()
		t.Fatal("a stranger reserved a slot on a closed relay")
	} else if !errors.Is(err, p2p.ErrRelay) {
		t.Fatalf("stranger: %v", err)
	}
	cfg.Admission = adm
	h, err := p2p.New(ctx, cfg)
	if err != nil {
		t.Fatalf("member reservation: %v", err)
	}
	h.Close()
}
