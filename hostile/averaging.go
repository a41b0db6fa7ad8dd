package hostile

import (
	"context"
	"encoding/binary"
	"fmt"
	"hash/fnv"
	"math"
	"math/rand/v2"
	"sync/atomic"

	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/core/protocol"

	"github.com/skyhive/skyhive/averaging"
	"github.com/skyhive/skyhive/averaging/optimizer"
	"github.com/skyhive/skyhive/p2p"
	"github.com/skyhive/skyhive/wire"
)

// AveragingTarget describes the honest group an averaging flood attacks:
// its members (by index in the session's member list) and the session
// they are averaging in now, which an attacker can predict (session IDs
// are derived from a run ID and a round counter).
type AveragingTarget struct {
	Members []averaging.Member
	// Session returns the ID of the group's current session.
	Session func() string
	// VecLen and ChunkElems are the group's vector length and chunk size,
	// from which the attacker computes the session's member-list hash.
	VecLen, ChunkElems int
}

// sessionHash mirrors the member-list hash of package averaging (FNV-1a
// over the members' IDs and weights, the vector length and the chunk
// settings), so impersonation attempts pass the hash check and reach the
// sender check. Should the two drift apart, the requests are still
// refused, by the hash check.
func sessionHash(members []averaging.Member, vecLen, chunkElems int, codec wire.Codec) uint64 {
	h := fnv.New64a()
	var b [8]byte
	for _, m := range members {
		h.Write([]byte(m.Peer.ID))
		binary.LittleEndian.PutUint64(b[:], math.Float64bits(m.Weight))
		h.Write(b[:])
	}
	binary.LittleEndian.PutUint64(b[:], uint64(vecLen))
	h.Write(b[:])
	binary.LittleEndian.PutUint64(b[:], uint64(chunkElems)<<8|uint64(codec))
	h.Write(b[:])
	return h.Sum64()
}

// reduceRequest encodes a chunk of an all-reduce contribution in
// averaging's ReduceProtocol format.
func reduceRequest(session string, hash uint64, sender, size, part int, chunk uint32, payload []byte) []byte {
	b := []byte{'S', 'K', 'A', 1, byte(len(session))}
	b = append(b, session...)
	b = binary.LittleEndian.AppendUint64(b, hash)
	b = binary.LittleEndian.AppendUint16(b, uint16(sender))
	b = binary.LittleEndian.AppendUint16(b, uint16(size))
	b = binary.LittleEndian.AppendUint16(b, uint16(part))
	b = binary.LittleEndian.AppendUint32(b, chunk)
	return append(b, payload...)
}

// activationRequest encodes a WAGMA activation (kind 1 group, 2 global).
func activationRequest(kind byte, round uint64, hash uint64) []byte {
	b := []byte{'S', 'K', 'W', 1, kind}
	b = binary.LittleEndian.AppendUint64(b, round)
	return binary.LittleEndian.AppendUint64(b, hash)
}

// hostilePayloadElems bounds the contributions the averaging attacks send:
// they are refused before their payload matters, and the flood is meant to
// be one of requests, not of bytes.
const hostilePayloadElems = 16 << 10

// AveragingAttacks are requests the members of an averaging group must
// refuse or shrug off, each sent to the members in turn: contributions
// full of NaN or 3e38 to fresh sessions that list the attacker (squatting
// the session table), the same to the group's current session
// impersonating another member (with the right member-list hash and with
// a wrong one), WAGMA activations of absurd rounds from outside the roster,
// a malformed header and a 4 GiB length prefix.
func AveragingAttacks(t AveragingTarget) []Attack {
	n := len(t.Members)
	chunk := min(t.ChunkElems, max(t.VecLen/max(n, 1), 1), hostilePayloadElems)
	vec := func(v float32) []byte {
		b, err := wire.Marshal(filledTensor(v, chunk), wire.Options{})
		if err != nil {
			panic(fmt.Sprintf("hostile: payload: %v", err))
		}
		return b
	}
	nanPayload, hugePayload := vec(float32(math.NaN())), vec(3e38)
	hash := sessionHash(t.Members, t.VecLen, t.ChunkElems, wire.CodecNone)
	var turn, squats atomic.Uint64
	// victim picks the next member to attack and its index.
	victim := func() (int, peer.AddrInfo) {
		j := int(turn.Add(1) % uint64(n))
		return j, t.Members[j].Peer
	}
	call := func(ctx context.Context, h *p2p.Host, to peer.AddrInfo, proto protocol.ID, req []byte) error {
		_, err := h.Call(ctx, to, proto, req)
		return err
	}
	squat := func(name string, payload []byte) Attack {
		return Attack{Name: name, Bytes: 4 + 64 + len(payload), Send: func(ctx context.Context, h *p2p.Host) error {
			_, to := victim()
			id := fmt.Sprintf("squat/%s/%d", h.ID().ShortString(), squats.Add(1))
			// A two-member session of the attacker (sender 1) and the
			// victim (part 0): held until the victim joins, which it
			// never does.
			return call(ctx, h, to, averaging.ReduceProtocol, reduceRequest(id, rand.Uint64(), 1, 2, 0, 0, payload))
		}}
	}
	impersonate := func(name string, payload []byte, hash func() uint64) Attack {
		return Attack{Name: name, Bytes: 4 + 64 + len(payload), Send: func(ctx context.Context, h *p2p.Host) error {
			j, to := victim()
			other := (j + 1) % n
			return call(ctx, h, to, averaging.ReduceProtocol, reduceRequest(t.Session(), hash(), other, n, j, 0, payload))
		}}
	}
	activate := func(name string, kind byte, round uint64) Attack {
		req := activationRequest(kind, round, hash)
		return Attack{Name: name, Bytes: 4 + len(req), Send: func(ctx context.Context, h *p2p.Host) error {
			_, to := victim()
			return call(ctx, h, to, optimizer.ActivateProtocol, req)
		}}
	}
	return []Attack{
		squat("squat-nan", nanPayload),
		squat("squat-3e38", hugePayload),
		impersonate("impersonate-nan", nanPayload, func() uint64 { return hash }),
		impersonate("impersonate-3e38-wrong-hash", hugePayload, rand.Uint64),
		activate("activate-global-2^31-1", 2, math.MaxInt32),
		activate("activate-group-2^30", 1, 1<<30),
		{Name: "malformed-header", Bytes: 15, Send: func(ctx context.Context, h *p2p.Host) error {
			_, to := victim()
			return call(ctx, h, to, averaging.ReduceProtocol, []byte("SKA\x09garbage"))
		}},
		{Name: "huge-length-prefix", Bytes: 4, Send: func(ctx context.Context, h *p2p.Host) error {
			_, to := victim()
			return sendLengthPrefix(ctx, h, to, averaging.ReduceProtocol, math.MaxUint32)
		}},
	}
}
