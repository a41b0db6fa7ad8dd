package averaging

import (
	"context"
	"testing"
	"time"

	"github.com/skyhive/skyhive/p2p/memnet"
)

// FuzzHandleReduce feeds arbitrary requests from a member to a reducer that
// has joined a session with it: whatever arrives, the reducer does not
// panic, keeps its table within the sender's share, and answers only a
// finite mean of the expected length.
func FuzzHandleReduce(f *testing.F) {
	net := memnet.NewNetwork()
	defer net.Close()
	victim, err := net.NewPeer()
	if err != nil {
		f.Fatal(err)
	}
	attacker, err := net.NewPeer()
	if err != nil {
		f.Fatal(err)
	}
	const length = 40
	cfg := Config{ChunkElems: 16, Timeout: 20 * time.Millisecond}
	sess := Session{ID: "s", Members: []Member{{Peer: victim.AddrInfo(), Weight: 1}, {Peer: attacker.AddrInfo(), Weight: 1}}}
	hash := sess.hash(cfg.withDefaults(), length)
	for _, chunk := range []uint32{0, 1, 7} {
		req := reduceRequest{Session: "s", Hash: hash, Sender: 1, Size: 2, Part: 0, Chunk: chunk}
		b, _ := appendVector(req.appendHeader(nil), make([]float32, 16), 0)
		f.Add(b)
	}
	f.Add(chunkRequest("other", 2))
	f.Add([]byte("SKA\x01\x01s"))
	f.Fuzz(func(t *testing.T, b []byte) {
		a := New(victim, cfg)
		defer a.Close()
		vec := make([]float32, length)
		bounds, _ := Partition(length, []float64{1, 1})
		s, err := a.join(sess, 0, bounds, vec)
		if err != nil {
			t.Fatal(err)
		}
		defer a.finish(s)
		ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
		defer cancel()
		resp, err := a.handleReduce(ctx, attacker.ID(), b)
		if n, pending := a.tableSize(); n > 1+DefaultMaxPendingPerPeer || pending > DefaultMaxPendingPerPeer {
			t.Fatalf("%d sessions, %d pending", n, pending)
		}
		if err != nil {
			return
		}
		_, p, err := unmarshalReduceResponse(resp, 2)
		if err != nil {
			t.Fatalf("answer: %v", err)
		}
		r, _ := unmarshalReduceRequest(b)
		want := min(16, bounds[1]-int(r.Chunk)*16)
		if _, err := decodeInto(p, make([]float32, want)); err != nil {
			t.Fatalf("answer does not decode: %v", err)
		}
	})
}
