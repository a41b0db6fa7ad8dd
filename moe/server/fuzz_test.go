package server

import (
	"math"
	"slices"
	"testing"

	"github.com/skyhive/skyhive/moe"
	"github.com/skyhive/skyhive/p2p/memnet"
	"github.com/skyhive/skyhive/tensor"
	"github.com/skyhive/skyhive/wire"
)

// FuzzParseRequest feeds arbitrary bytes to the server-side decoding and
// validation of forward and backward requests, for an FFN and a
// transformer server. It must never panic, and whatever it accepts must be
// a request the expert can run: the expert's rank and hidden size, at
// most MaxBatch rows and MaxSeqLen tokens, values finite and within
// MaxAbsValue, dy shaped like x, and working memory within RequestMemory.
func FuzzParseRequest(f *testing.F) {
	n := memnet.NewNetwork()
	f.Cleanup(func() { n.Close() })
	newServer := func(cfg Config) *Server {
		p, err := n.NewPeer()
		if err != nil {
			f.Fatal(err)
		}
		cfg.Transport, cfg.Lazy = p, true
		s, err := New(cfg)
		if err != nil {
			f.Fatal(err)
		}
		f.Cleanup(func() { s.Close() })
		return s
	}
	servers := []*Server{
		newServer(Config{Experts: []string{"ffn.0"}, Hidden: 4, MaxBatch: 8}),
		newServer(Config{Experts: []string{"t.0"}, Type: TypeTransformer, Hidden: 4, Heads: 2, MaxBatch: 4, MaxSeqLen: 6, RequestMemory: 4 << 10}),
	}
	add := func(uid string, o wire.Options, ts ...*tensor.Tensor) {
		msg := []wire.Named{{Name: "x", Tensor: ts[0]}}
		if len(ts) > 1 {
			msg = append(msg, wire.Named{Name: "dy", Tensor: ts[1]})
		}
		req, err := moe.EncodeRequest(uid, msg, o)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(req, len(ts) > 1)
	}
	add("ffn.0", wire.Options{}, randTensor(1, 2, 4))
	add("ffn.0", wire.Options{Codec: wire.CodecFP16}, randTensor(1, 2, 4), randTensor(2, 2, 4))
	add("ffn.0", wire.Options{}, filled(3e38, 2, 4), randTensor(2, 2, 4))
	add("t.0", wire.Options{}, randTensor(1, 1, 3, 4))
	add("t.0", wire.Options{}, randTensor(1, 2, 3, 4), randTensor(2, 2, 3, 4))
	add("t.0", wire.Options{}, randTensor(1, 1, 7, 4))
	f.Add([]byte("SKX\x01\x05ffn.0"), false)
	f.Fuzz(func(t *testing.T, req []byte, backward bool) {
		for _, s := range servers {
			e, x, dy, work, err := s.parse(req, backward)
			if err != nil {
				continue
			}
			c := &s.cfg
			if len(x.Shape) != e.spec.InputDims || x.Shape[len(x.Shape)-1] != c.Hidden || x.Shape[0] < 1 || x.Shape[0] > c.MaxBatch {
				t.Fatalf("accepted x of shape %v", x.Shape)
			}
			if e.spec.InputDims == 3 && (x.Shape[1] < 1 || x.Shape[1] > c.MaxSeqLen) {
				t.Fatalf("accepted sequence length %d", x.Shape[1])
			}
			if backward != (dy != nil) || (dy != nil && !slices.Equal(dy.Shape, x.Shape)) {
				t.Fatalf("accepted dy %v for x %v (backward %v)", dy, x.Shape, backward)
			}
			if work <= 0 || work > c.RequestMemory {
				t.Fatalf("accepted a request needing %d bytes", work)
			}
			for _, v := range append(slices.Clone(x.Data), dyData(dy)...) {
				if math.Abs(float64(v)) > c.MaxAbsValue || v != v {
					t.Fatalf("accepted value %g", v)
				}
			}
		}
	})
}

func dyData(dy *tensor.Tensor) []float32 {
	if dy == nil {
		return nil
	}
	return dy.Data
}
