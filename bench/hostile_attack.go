// The hostile peer of the hostile suite: kinds of requests that an honest
// victim must refuse, and a flood that sends them at a fixed rate from
// several identities and tallies the victims' verdicts. The attacks only
// build bytes and send them over p2p, so they can later drive a hostile
// peer program against a swarm of real processes.

package bench

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"math"
	"math/rand/v2"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/core/protocol"

	"github.com/skyhive/skyhive/averaging"
	"github.com/skyhive/skyhive/averaging/optimizer"
	"github.com/skyhive/skyhive/moe"
	"github.com/skyhive/skyhive/p2p"
	"github.com/skyhive/skyhive/tensor"
	"github.com/skyhive/skyhive/wire"
)

// Attack is one kind of hostile request. Send sends one from h and returns
// the victim's answer: nil if the victim accepted it, a *p2p.RemoteError
// if it refused it.
type Attack struct {
	Name string
	Send func(ctx context.Context, h *p2p.Host) error
	// Bytes is the size of one request, about (for the flood's byte rate).
	Bytes int
}

// Flood sends Attacks, in turn, from Hosts (the attacker's identities) at
// a fixed rate, and counts how the victims answered. Pacing the flood,
// rather than sending flat out, keeps the attacker's own CPU use fixed, so
// that on a shared machine the victims' throughput measures their
// robustness and not the CPU the attacker takes. Requests are sent on a
// clock, each in its own goroutine, so a victim that holds requests does
// not slow the flood down, up to MaxInflight requests at once.
type Flood struct {
	// Hosts are the attacker's identities, used in turn (required).
	Hosts []*p2p.Host
	// Attacks are the kinds of requests, sent in turn (required).
	Attacks []Attack
	// Rate is the requests per second (required).
	Rate float64
	// MaxInflight bounds the requests awaiting their verdict (64); a
	// tick that finds them all busy is skipped, so the rate reached
	// (FloodTally.Rate) may be lower than Rate.
	MaxInflight int
	// CallTimeout bounds each request (1 s); a request the victim holds
	// longer counts as unanswered.
	CallTimeout time.Duration

	mu      sync.Mutex
	tally   map[string]*AttackTally
	skipped int64
	elapsed time.Duration
}

// AttackTally counts the verdicts on one kind of request.
type AttackTally struct {
	// Sent counts requests whose verdict arrived (or timed out) before the
	// flood stopped.
	Sent int64 `json:"sent"`
	// Refused counts requests answered with an error or a reset stream.
	Refused int64 `json:"refused"`
	// Unanswered counts requests the victim held past CallTimeout.
	Unanswered int64 `json:"unanswered"`
	// Accepted counts requests the victim answered as valid.
	Accepted int64 `json:"accepted"`
	// Bytes sums the sizes of the requests sent.
	Bytes int64 `json:"bytes"`
}

func (t *AttackTally) add(o AttackTally) {
	t.Sent += o.Sent
	t.Refused += o.Refused
	t.Unanswered += o.Unanswered
	t.Accepted += o.Accepted
	t.Bytes += o.Bytes
}

// FloodTally sums a flood's verdicts over all the times it ran.
type FloodTally struct {
	AttackTally
	// ByAttack breaks the counts down by Attack.Name.
	ByAttack map[string]AttackTally
	// Skipped counts ticks skipped because MaxInflight requests were
	// awaiting their verdicts.
	Skipped int64
	// Seconds is the time the flood ran; Rate is Sent/Seconds.
	Seconds, Rate float64
}

// Run floods until ctx ends and returns once every request in flight has
// ended (those cut short by ctx get no verdict). It may be called again;
// the tallies accumulate.
func (f *Flood) Run(ctx context.Context) {
	inflight := f.MaxInflight
	if inflight <= 0 {
		inflight = 64
	}
	timeout := f.CallTimeout
	if timeout <= 0 {
		timeout = time.Second
	}
	if f.Rate <= 0 || len(f.Hosts) == 0 || len(f.Attacks) == 0 {
		return
	}
	sem := make(chan struct{}, inflight)
	tick := time.NewTicker(time.Duration(float64(time.Second) / f.Rate))
	defer tick.Stop()
	start := time.Now()
	var wg sync.WaitGroup
	var skipped int64
	for i := 0; ; i++ {
		a := f.Attacks[i%len(f.Attacks)]
		h := f.Hosts[(i/len(f.Attacks))%len(f.Hosts)]
		select {
		case sem <- struct{}{}:
			wg.Go(func() {
				defer func() { <-sem }()
				cctx, cancel := context.WithTimeout(ctx, timeout)
				err := a.Send(cctx, h)
				timedOut := cctx.Err() != nil
				cancel()
				if ctx.Err() == nil {
					f.count(a, err, timedOut)
				}
			})
		default:
			skipped++
		}
		select {
		case <-tick.C:
		case <-ctx.Done():
			wg.Wait()
			f.mu.Lock()
			f.elapsed += time.Since(start)
			f.skipped += skipped
			f.mu.Unlock()
			return
		}
	}
}

func (f *Flood) count(a Attack, err error, timedOut bool) {
	name := a.Name
	v := AttackTally{Sent: 1, Bytes: int64(a.Bytes)}
	switch {
	case err == nil:
		v.Accepted = 1
	case timedOut && !isRemote(err):
		v.Unanswered = 1
	default:
		// An error answer, or a stream or connection the victim reset.
		v.Refused = 1
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.tally == nil {
		f.tally = map[string]*AttackTally{}
	}
	if f.tally[name] == nil {
		f.tally[name] = &AttackTally{}
	}
	f.tally[name].add(v)
}

func isRemote(err error) bool {
	var re *p2p.RemoteError
	return errors.As(err, &re)
}

// Tally returns the counts so far.
func (f *Flood) Tally() FloodTally {
	f.mu.Lock()
	defer f.mu.Unlock()
	t := FloodTally{ByAttack: map[string]AttackTally{}, Skipped: f.skipped, Seconds: f.elapsed.Seconds()}
	for name, a := range f.tally {
		t.ByAttack[name] = *a
		t.add(*a)
	}
	if t.Seconds > 0 {
		t.Rate = float64(t.Sent) / t.Seconds
	}
	return t
}

// Breakdown lists the counts by attack, sorted by name, for notes.
func (t FloodTally) Breakdown() string {
	names := make([]string, 0, len(t.ByAttack))
	for n := range t.ByAttack {
		names = append(names, n)
	}
	sort.Strings(names)
	var b strings.Builder
	for i, n := range names {
		a := t.ByAttack[n]
		if i > 0 {
			b.WriteString("; ")
		}
		fmt.Fprintf(&b, "%s %d/%d refused", n, a.Refused, a.Sent)
		if a.Unanswered > 0 {
			fmt.Fprintf(&b, ", %d held", a.Unanswered)
		}
		if a.Accepted > 0 {
			fmt.Fprintf(&b, ", %d ACCEPTED", a.Accepted)
		}
	}
	return b.String()
}

// callAttack is an attack that sends fixed bytes over proto's RPC.
func callAttack(name string, to peer.AddrInfo, proto protocol.ID, req []byte) Attack {
	return Attack{Name: name, Bytes: 4 + len(req), Send: func(ctx context.Context, h *p2p.Host) error {
		_, err := h.Call(ctx, to, proto, req)
		return err
	}}
}

// hugeLengthAttack opens a raw stream for proto and sends only a request
// length prefix of 4 GiB − 1, the most the RPC framing can claim; the
// victim must refuse it before allocating.
func hugeLengthAttack(to peer.AddrInfo, proto protocol.ID) Attack {
	return Attack{Name: "huge-length-prefix", Bytes: 4, Send: func(ctx context.Context, h *p2p.Host) error {
		return sendLengthPrefix(ctx, h, to, proto, math.MaxUint32)
	}}
}

// sendLengthPrefix writes a bare RPC length prefix and reads the answer.
func sendLengthPrefix(ctx context.Context, h *p2p.Host, to peer.AddrInfo, proto protocol.ID, n uint32) error {
	if err := h.Connect(ctx, to); err != nil {
		return err
	}
	s, err := h.LibP2P().NewStream(ctx, to.ID, proto)
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
		panic(fmt.Sprintf("bench: hostile expert request: %v", err))
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
	return []Attack{
		backward("backward-nan", poisoned(7, float32(math.NaN()))),
		backward("backward-inf", poisoned(11, float32(math.Inf(1)))),
		backward("backward-3e38", filledTensor(3e38, batch, hidden)),
		forward("forward-wrong-hidden", expertRequest(uid, wire.Named{Name: "x", Tensor: filledTensor(0.5, batch, max(hidden/2, 1))})),
		forward("forward-batch-claim", append(expertPrefix(uid), claimedShape(max(1<<30, 2*maxBatch), hidden)...)),
		forward("forward-seq-claim", append(expertPrefix(uid), claimedShape(1, 1<<18, hidden)...)),
		forward("forward-unknown-expert", expertRequest(prefix+".424242", wire.Named{Name: "x", Tensor: x})),
		hugeLengthAttack(to, moe.ForwardProtocol),
	}
}

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
			panic(fmt.Sprintf("bench: hostile payload: %v", err))
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
