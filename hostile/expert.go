package hostile

import (
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"math"
	"math/rand/v2"

	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/core/protocol"

	"github.com/skyhive/skyhive/moe"
	"github.com/skyhive/skyhive/p2p"
	"github.com/skyhive/skyhive/tensor"
	"github.com/skyhive/skyhive/wire"
)

// callAttack is an attack that sends fixed bytes over proto's RPC.
func callAttack(name string, to peer.AddrInfo, proto protocol.ID, req []byte) Attack {
	return Attack{Name: name, Bytes: 4 + len(req), Victim: to.ID, Send: func(ctx context.Context, h *p2p.Host) error {
		_, err := h.Call(ctx, to, proto, req)
		return err
	}}
}

// hugeLengthAttack opens a raw stream for proto and sends only a request
// length prefix of 4 GiB − 1, the most the RPC framing can claim; the
// victim must refuse it before allocating.
func hugeLengthAttack(to peer.AddrInfo, proto protocol.ID) Attack {
	return Attack{Name: "huge-length-prefix", Bytes: 4, Victim: to.ID, Send: func(ctx context.Context, h *p2p.Host) error {
		return sendLengthPrefix(ctx, h, to, proto, math.MaxUint32)
	}}
}

// rawStream opens a bare libp2p stream of proto to a victim, for writing
// what the RPC framing would not.
func rawStream(ctx context.Context, h *p2p.Host, to peer.AddrInfo, proto protocol.ID) (network.Stream, error) {
	if err := h.Connect(ctx, to); err != nil {
		return nil, err
	}
	return h.LibP2P().NewStream(ctx, to.ID, proto)
}

// sendLengthPrefix writes a bare RPC length prefix and reads the answer.
func sendLengthPrefix(ctx context.Context, h *p2p.Host, to peer.AddrInfo, proto protocol.ID, n uint32) error {
	s, err := rawStream(ctx, h, to, proto)
	if err != nil {
		return err
	}
	defer s.Reset()
	if dl, ok := ctx.Deadline(); ok {
		_ = s.SetDeadline(dl)
	}
	var hdr [5]byte
	binary.BigEndian.PutUint32(hdr[:4], n)
	if _, err := s.Write(hdr[:4]); err != nil {
		return err
	}
	if _, err := io.ReadFull(s, hdr[:]); err != nil {
		return err
	}
	m := min(binary.BigEndian.Uint32(hdr[1:]), 4<<10)
	msg := make([]byte, m)
	if _, err := io.ReadFull(s, msg); err != nil {
		return err
	}
	if hdr[0] != 0 {
		return &p2p.RemoteError{Peer: to.ID, Proto: proto, Msg: string(msg)}
	}
	return nil
}

// claimedShape encodes a message whose only tensor, "x", claims shape but
// carries just 64 bytes of data: a request that would make a careless
// decoder allocate for the claim.
func claimedShape(shape ...int) []byte {
	b := []byte{'S', 'K', 'M', 1, 1, 0, 1, 'x', 'S', 'K', 'T', 1, 1, byte(wire.CodecNone), byte(len(shape)), 0}
	for _, d := range shape {
		b = binary.LittleEndian.AppendUint32(b, uint32(d))
	}
	return append(b, make([]byte, 64)...)
}

// expertRequest encodes an expert request; the attacks' requests are
// always encodable, so an error is a bug.
func expertRequest(uid string, msg ...wire.Named) []byte {
	b, err := moe.EncodeRequest(uid, msg, wire.Options{})
	if err != nil {
		panic(fmt.Sprintf("hostile: expert request: %v", err))
	}
	return b
}

// expertPrefix is the header of an expert request for uid (see
// moe.EncodeRequest), to which a crafted message is appended.
func expertPrefix(uid string) []byte {
	return append([]byte{'S', 'K', 'X', 1, byte(len(uid))}, uid...)
}

func filledTensor(v float32, shape ...int) *tensor.Tensor {
	t := tensor.New(shape...)
	for i := range t.Data {
		t.Data[i] = v
	}
	return t
}

// ExpertAttacks are requests an expert server hosting uid (an expert of
// input [batch, hidden], at most maxBatch rows) must refuse: backward calls
// with NaN, Inf and 3e38 gradients, a wrong hidden size, batch and
// sequence-length claims far beyond the server's bounds, an expert that
// does not exist, and a 4 GiB length prefix. The poisoned gradients come
// with a valid input of batch rows, so they cost the victim what an honest
// request of that size costs to receive.
func ExpertAttacks(to peer.AddrInfo, uid string, hidden, batch, maxBatch int) []Attack {
	rng := rand.New(rand.NewPCG(13, 13))
	x := tensor.New(batch, hidden)
	tensor.FillNormal(x.Data, rng, 0, 1)
	dy := tensor.New(batch, hidden)
	tensor.FillNormal(dy.Data, rng, 0, 0.01)
	poisoned := func(i int, v float32) *tensor.Tensor {
		t := dy.Clone()
		t.Data[i%len(t.Data)] = v
		return t
	}
	backward := func(name string, g *tensor.Tensor) Attack {
		return callAttack(name, to, moe.BackwardProtocol,
			expertRequest(uid, wire.Named{Name: "x", Tensor: x}, wire.Named{Name: "dy", Tensor: g}))
	}
	forward := func(name string, req []byte) Attack { return callAttack(name, to, moe.ForwardProtocol, req) }
	prefix, _, err := moe.SplitUID(uid)
	if err != nil {
		prefix = "ffn"
	}
	// The poisoned gradients come last: they get the identity blocked,
	// so each identity tries the other attacks first.
	return []Attack{
		forward("forward-wrong-hidden", expertRequest(uid, wire.Named{Name: "x", Tensor: filledTensor(0.5, batch, max(hidden/2, 1))})),
		forward("forward-batch-claim", append(expertPrefix(uid), claimedShape(max(1<<30, 2*maxBatch), hidden)...)),
		forward("forward-seq-claim", append(expertPrefix(uid), claimedShape(1, 1<<18, hidden)...)),
		forward("forward-unknown-expert", expertRequest(prefix+".424242", wire.Named{Name: "x", Tensor: x})),
		hugeLengthAttack(to, moe.ForwardProtocol),
		backward("backward-nan", poisoned(7, float32(math.NaN()))),
		backward("backward-inf", poisoned(11, float32(math.Inf(1)))),
		backward("backward-3e38", filledTensor(3e38, batch, hidden)),
	}
}
