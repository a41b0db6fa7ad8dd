package averaging

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/fnv"
	"math"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/skyhive/skyhive/clock"
	"github.com/skyhive/skyhive/p2p"
	"github.com/skyhive/skyhive/wire"
)

// Defaults of Config.
const (
	DefaultChunkElems = 1 << 18 // 1 MiB of float32 per message
	DefaultWindow     = 4
	DefaultTimeout    = 30 * time.Second
	DefaultMaxSession = 256
	// DefaultMaxPendingPerPeer bounds the sessions one peer may announce
	// here before this peer joins them.
	DefaultMaxPendingPerPeer = 4
	// DefaultMaxElements bounds a vector (256 MiB of float32).
	DefaultMaxElements = 1 << 26
	maxChunkElems      = 2 << 20 // keeps an uncompressed chunk under 16 MiB messages
)

// Errors returned (wrapped) by AllReduce.
var (
	// ErrClosed means the Averager is closed.
	ErrClosed = errors.New("averaging: closed")
	// ErrJoined means this peer already joined the session.
	ErrJoined = errors.New("averaging: session already joined")
	// ErrNotMember means this peer is not in the session's member list.
	ErrNotMember = errors.New("averaging: not a member of the session")
	// ErrDeclined means this peer declined the session (Decline).
	ErrDeclined = errors.New("averaging: session declined")
)

// Member is one participant of a group all-reduce.
type Member struct {
	// Peer is how to reach the member.
	Peer peer.AddrInfo
	// Weight sets the member's share of the reduce-scatter; use its
	// bandwidth for DeDLOC-style splitting, equal weights for an even split,
	// 0 for a member that contributes but reduces nothing.
	Weight float64
}

// Session is one all-reduce. Every member calls AllReduce with the same ID
// and the same Members in the same order; messages of members that disagree
// are rejected.
type Session struct {
	ID      string
	Members []Member
}

// Config tunes an Averager. Zero fields take the defaults.
type Config struct {
	// Codec compresses contributions and averages on the wire (none, fp16,
	// uniform8, quantile8).
	Codec wire.Codec
	// ChunkElems is the number of elements per message (1<<18, at most
	// 2<<20 so that a chunk stays under the transports' message limit).
	ChunkElems int
	// Window is the number of chunks in flight to each reducer (2).
	Window int
	// Timeout bounds one AllReduce call from start to return (30 s).
	Timeout time.Duration
	// ReduceWait is how long a reducer waits for missing contributions
	// after it joins, and how long a contribution for a session this peer
	// has not joined yet waits for the join (Timeout/2). Members that have
	// not contributed by then are left out of the mean.
	ReduceWait time.Duration
	// MaxElements bounds the vector of one session (1<<26).
	MaxElements int
	// MaxSessions bounds the sessions remembered at once, joined or only
	// announced by a member's first message (256); announced ones take at
	// most half of it, and this peer's own joins evict them if needed.
	MaxSessions int
	// MaxPendingPerPeer bounds the sessions one peer may announce (by a
	// chunk or leave notice for a session not joined here yet) and hold
	// at once (4), and its chunks waiting for joins to 4·Window. Requests
	// beyond are refused; honest senders retry until the join.
	MaxPendingPerPeer int

	// MaxNormRatio drops another member's contribution to a chunk whose
	// norm exceeds this multiple of both the median norm of the chunk's
	// contributions and the RMS of this peer's part scaled to the chunk
	// (DefaultMaxNormRatio; negative: no check). The floor keeps sparse
	// gradients whole: a chunk one member left at zero does not make the
	// others' look hostile. The mean is then over the remaining
	// contributions; such members are listed in Result.Rejected.
	// Answers whose norm exceeds this multiple of this peer's own chunk
	// (or of its vector's RMS scaled to the chunk, if larger) are refused
	// too (the part keeps its own values, Result.Failed).
	MaxNormRatio float64
	// Aggregation is the rule a reducer combines contributions with
	// (AggregateMean, the default; AggregateCenteredClip or
	// AggregateTrimmedMean for open swarms).
	Aggregation Aggregation
	// ClipRadius is CenteredClip's τ (0: twice the median distance of the
	// contributions from their coordinate-wise median).
	ClipRadius float64
	// Trim is the trimmed mean's fraction cut at each end (DefaultTrim).
	Trim float64
}

func (c Config) withDefaults() Config {
	if c.ChunkElems <= 0 {
		c.ChunkElems = DefaultChunkElems
	}
	c.ChunkElems = min(c.ChunkElems, maxChunkElems)
	if c.Window <= 0 {
		c.Window = DefaultWindow
	}
	if c.Timeout <= 0 {
		c.Timeout = DefaultTimeout
	}
	if c.ReduceWait <= 0 || c.ReduceWait > c.Timeout {
		c.ReduceWait = c.Timeout / 2
	}
	if c.MaxElements <= 0 {
		c.MaxElements = DefaultMaxElements
	}
	if c.MaxSessions <= 0 {
		c.MaxSessions = DefaultMaxSession
	}
	c.MaxSessions = max(c.MaxSessions, 2)
	if c.MaxPendingPerPeer <= 0 {
		c.MaxPendingPerPeer = DefaultMaxPendingPerPeer
	}
	if c.MaxNormRatio == 0 || math.IsNaN(c.MaxNormRatio) {
		c.MaxNormRatio = DefaultMaxNormRatio
	}
	if c.Aggregation == "" {
		c.Aggregation = AggregateMean
	}
	if c.ClipRadius < 0 || math.IsNaN(c.ClipRadius) {
		c.ClipRadius = 0
	}
	if c.Trim <= 0 || c.Trim >= 0.5 || math.IsNaN(c.Trim) {
		c.Trim = DefaultTrim
	}
	return c
}

// Result describes one AllReduce from this member's point of view.
type Result struct {
	// Size is the number of members.
	Size int
	// Contributors is the smallest number of members, this one included,
	// whose contribution reached any chunk of this member's part.
	Contributors int
	// Missing lists members whose contribution to this member's part did
	// not arrive before ReduceWait ended.
	Missing []peer.ID
	// Failed lists members whose part could not be averaged (the member
	// died, stalled, rejected the session or answered an implausible
	// mean); that part of the vector keeps this member's own values.
	Failed []peer.ID
	// Rejected lists members whose contribution to some chunk of this
	// member's part was dropped by the norm check (Config.MaxNormRatio).
	Rejected []peer.ID
	// Declined lists members that declined the session (Averager.Decline)
	// instead of joining it: nothing of theirs is averaged, their part
	// keeps this member's values, and they are in neither Missing nor
	// Failed.
	Declined []peer.ID
	// Disagreed lists members that joined the session with another member
	// list or other settings (a chunk with another session hash), and up
	// to 16 peers not listed that sent chunks of it that way: they are
	// alive, but nothing of theirs is averaged and a listed one's part
	// keeps this member's values. Not in Missing or Failed.
	Disagreed []peer.ID
	// Sent and Received count payload bytes.
	Sent, Received int64
	// Elapsed is the wall time of the call.
	Elapsed time.Duration
}

// Averager runs group all-reduces over a transport. It registers a handler
// for ReduceProtocol. All methods are safe for concurrent use.
type Averager struct {
	t    p2p.Transport
	cfg  Config
	done chan struct{}

	now     func() time.Time
	refused atomic.Int64

	mu        sync.Mutex
	closed    bool
	sessions  map[string]*session
	pending   map[peer.ID]int // pending sessions by announcer
	npending  int
	waiting   map[peer.ID]int // requests waiting for a join, by sender
	nextSweep time.Time
}

// New returns an Averager on t and registers its handler. With an
// unknown cfg.Aggregation (see ParseAggregation) every AllReduce fails.
func New(t p2p.Transport, cfg Config) *Averager {
	cfg = cfg.withDefaults()
	a := &Averager{t: t, cfg: cfg, done: make(chan struct{}), now: time.Now, sessions: map[string]*session{},
		pending: map[peer.ID]int{}, waiting: map[peer.ID]int{}}
	t.SetHandler(ReduceProtocol, a.handleReduce)
	t.SetHandler(LeaveProtocol, a.handleLeave)
	return a
}

// Config returns the configuration in force, defaults filled in.
func (a *Averager) Config() Config { return a.cfg }

// Transport returns the transport the Averager runs on.
func (a *Averager) Transport() p2p.Transport { return a.t }

// Close makes running and future calls fail and releases waiting handlers.
func (a *Averager) Close() error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if !a.closed {
		a.closed = true
		close(a.done)
		for _, s := range a.sessions {
			s.stop()
		}
		a.sessions = map[string]*session{}
		a.pending, a.npending = map[peer.ID]int{}, 0
	}
	return nil
}

// Refused counts requests refused because their sender's share of the
// session table, or the table of pending sessions, was full.
func (a *Averager) Refused() int64 { return a.refused.Load() }

func (s Session) hash(cfg Config, vecLen int) uint64 {
	h := fnv.New64a()
	var b [8]byte
	for _, m := range s.Members {
		h.Write([]byte(m.Peer.ID))
		binary.LittleEndian.PutUint64(b[:], math.Float64bits(m.Weight))
		h.Write(b[:])
	}
	binary.LittleEndian.PutUint64(b[:], uint64(vecLen))
	h.Write(b[:])
	binary.LittleEndian.PutUint64(b[:], uint64(cfg.ChunkElems)<<8|uint64(cfg.Codec))
	h.Write(b[:])
	return h.Sum64()
}

// leave tells the other members that this one stopped, best effort and
// briefly, so that they do not wait for it until ReduceWait.
func (a *Averager) leave(sess *session, members []Member) {
	a.notify(context.Background(), leaveNotice{Session: sess.id, Hash: sess.hash}, members, sess.self)
}

// notify sends a leave or decline notice to every member but self, best
// effort, and waits at most a second (or ReduceWait) for the calls.
func (a *Averager) notify(ctx context.Context, l leaveNotice, members []Member, self int) {
	ctx, cancel := context.WithTimeout(ctx, min(time.Second, a.cfg.ReduceWait))
	defer cancel()
	msg := l.marshal()
	var wg sync.WaitGroup
	for j, m := range members {
		if j != self {
			wg.Go(func() { _, _ = a.t.Call(ctx, m.Peer, LeaveProtocol, msg) })
		}
	}
	wg.Wait()
}

// Decline tells the members of session s, which this peer will not join
// (it is busy), not to wait for it: their all-reduces go on without it at
// once and list it in Result.Declined, and this peer refuses the chunks
// sent to it for s. vecLen is the length of the vector the members
// average (their session hash covers it). It returns once the notices are
// sent, within a second; joining s afterwards fails with ErrDeclined.
func (a *Averager) Decline(ctx context.Context, s Session, vecLen int) error {
	self, _, err := s.check(a.t.ID())
	if err != nil {
		return err
	}
	a.mu.Lock()
	if a.closed {
		a.mu.Unlock()
		return ErrClosed
	}
	now := a.now()
	sess, err := a.ownSessionLocked(s.ID, now)
	if err != nil {
		a.mu.Unlock()
		return err
	}
	a.unpendLocked(sess)
	sess.declined = true
	sess.expires = now.Add(a.cfg.Timeout + a.cfg.ReduceWait)
	a.mu.Unlock()
	// The notices go first, so that a member whose chunk is refused below
	// has already heard why.
	a.notify(ctx, leaveNotice{Session: s.ID, Hash: s.hash(a.cfg, vecLen), Decline: true}, s.Members, self)
	close(sess.gone)
	return nil
}

// check validates the session and returns the index of the member id in
// it and the members' weights.
func (s Session) check(id peer.ID) (int, []float64, error) {
	if len(s.ID) == 0 || len(s.ID) > MaxSessionLen {
		return 0, nil, fmt.Errorf("averaging: session ID of %d bytes", len(s.ID))
	}
	if len(s.Members) == 0 || len(s.Members) > MaxGroupSize {
		return 0, nil, fmt.Errorf("averaging: %d members", len(s.Members))
	}
	self := -1
	weights := make([]float64, len(s.Members))
	seen := map[peer.ID]bool{}
	for i, m := range s.Members {
		if seen[m.Peer.ID] {
			return 0, nil, fmt.Errorf("averaging: member %s listed twice", m.Peer.ID)
		}
		seen[m.Peer.ID] = true
		if m.Peer.ID == id {
			self = i
		}
		weights[i] = m.Weight
	}
	if self < 0 {
		return 0, nil, ErrNotMember
	}
	return self, weights, nil
}

// decodeVector decodes a wire tensor of exactly want finite elements.
func decodeVector(b []byte, want int) ([]float32, error) {
	t, err := wire.Unmarshal(b, wire.Limits{MaxElements: max(want, 1), MaxDims: 1})
	if err != nil {
		return nil, fmt.Errorf("averaging: decode chunk: %w", err)
	}
	if t.Len() != want {
		return nil, fmt.Errorf("%w: chunk of %d elements, want %d", ErrMessage, t.Len(), want)
	}
	for _, v := range t.Data {
		if math.IsNaN(float64(v)) || math.IsInf(float64(v), 0) {
			return nil, fmt.Errorf("%w: non-finite value in chunk", ErrMessage)
		}
	}
	return t.Data, nil
}

// AllReduce replaces vec, in place, by the mean of the members' vectors.
// The vector is split into one part per member (sized by the weights); each
// member reduces its part from the others' chunks (reduce-scatter) and
// answers every chunk with its mean (all-gather). A member that has not
// contributed within ReduceWait is left out of the mean, and so is, for the
// chunks it has not sent, one that has by then been silent for
// ReduceWait/2 while the others sent a chunk it lacks; a part whose
// reducer fails keeps this member's values and is reported in
// Result.Failed. AllReduce returns within Config.Timeout.
//
// All members must pass vectors of the same length. On error the vector
// holds a mix of averaged and local parts.
func (a *Averager) AllReduce(ctx context.Context, s Session, vec []float32) (Result, error) {
	start := time.Now()
	res := Result{Size: len(s.Members)}
	if _, err := ParseAggregation(string(a.cfg.Aggregation)); err != nil {
		return res, err
	}
	self, weights, err := s.check(a.t.ID())
	if err != nil {
		return res, err
	}
	if len(vec) == 0 || len(vec) > a.cfg.MaxElements {
		return res, fmt.Errorf("averaging: vector of %d elements (limit %d)", len(vec), a.cfg.MaxElements)
	}
	bounds, err := Partition(len(vec), weights)
	if err != nil {
		return res, err
	}
	ctx, cancel := context.WithDeadline(ctx, start.Add(a.cfg.Timeout))
	defer cancel()
	sess, err := a.join(s, self, bounds, vec)
	if err != nil {
		return res, err
	}
	if a.cfg.MaxNormRatio > 0 {
		// The answer check's floor, computed beside the first sends.
		sess.rmsReady = make(chan struct{})
		go func() {
			sess.rms = Norm(vec) / math.Sqrt(float64(len(vec)))
			close(sess.rmsReady)
		}()
		defer func() { <-sess.rmsReady }()
	}

	var sent, recv atomic.Int64
	failed := make([]bool, len(s.Members))
	var wg sync.WaitGroup
	a.sendParts(ctx, &wg, sess, s, self, bounds, vec, failed, &sent, &recv)

	// This member's own part.
	missing := make([]bool, len(s.Members))
	var ownErr error
	res.Contributors, ownErr = a.reduceOwn(ctx, sess, vec, len(s.Members), missing)
	wg.Wait()
	a.finish(sess)
	if errors.Is(ctx.Err(), context.Canceled) {
		a.leave(sess, s.Members) // stopped by the caller, not timed out
	}
	tallyMembers(&res, sess, s, failed, missing)
	res.Sent, res.Received = sent.Load(), recv.Load()
	res.Elapsed = time.Since(start)
	if ownErr != nil {
		return res, fmt.Errorf("averaging: session %s: %w", s.ID, ownErr)
	}
	return res, nil
}

// sendParts sends every other member its part of vec (between bounds),
// one goroutine each in wg; a member whose exchange fails is marked in
// failed, and one that answers it disagrees is dropped from the session.
func (a *Averager) sendParts(ctx context.Context, wg *sync.WaitGroup, sess *session, s Session, self int, bounds []int, vec []float32, failed []bool, sent, recv *atomic.Int64) {
	for j := range s.Members {
		if j == self || bounds[j] == bounds[j+1] {
			continue
		}
		wg.Go(func() {
			if err := a.sendPart(ctx, sess, j, s.Members[j].Peer, vec[bounds[j]:bounds[j+1]], sent, recv); err != nil {
				failed[j] = true
				var remote *p2p.RemoteError
				if errors.As(err, &remote) && strings.Contains(remote.Msg, errDisagree.Error()) {
					sess.drop(s.Members[j].Peer.ID, dropDisagreed) // alive, with another view
				}
			}
		})
	}
}

// reduceOwn waits for each chunk of this member's own part to be reduced
// and writes the average into vec. It marks in missing the members whose
// contribution a chunk lacks and returns the fewest contributors to any
// chunk (at most members), with the error that ended the wait early.
func (a *Averager) reduceOwn(ctx context.Context, sess *session, vec []float32, members int, missing []bool) (int, error) {
	contributors := members
	for i, c := range sess.chunks {
		if err := c.wait(ctx, a.done); err != nil {
			return contributors, err
		}
		if sess.rmsReady != nil {
			<-sess.rmsReady // the floor reads the whole vector
		}
		lo := sess.lo + i*a.cfg.ChunkElems
		sess.mu.Lock()
		// With compression use what the other members receive, so all
		// hold the same average.
		if a.cfg.Codec == wire.CodecNone {
			copy(vec[lo:], c.sum)
		} else if _, err := decodeInto(c.resp[2:], vec[lo:lo+len(c.sum)]); err != nil {
			copy(vec[lo:], c.sum)
		}
		contributors = min(contributors, c.count)
		for j, ok := range c.from {
			missing[j] = missing[j] || !ok
		}
		sess.mu.Unlock()
	}
	return contributors, nil
}

// tallyMembers records in res which members declined, disagreed, were missing,
// failed or were rejected in the finished session.
func tallyMembers(res *Result, sess *session, s Session, failed, missing []bool) {
	sess.mu.Lock()
	for j := range s.Members {
		switch {
		case sess.declinedBy[j]:
			res.Declined = append(res.Declined, s.Members[j].Peer.ID)
		case sess.disagreed[j]:
			res.Disagreed = append(res.Disagreed, s.Members[j].Peer.ID)
		default:
			if missing[j] {
				res.Missing = append(res.Missing, s.Members[j].Peer.ID)
			}
			if failed[j] {
				res.Failed = append(res.Failed, s.Members[j].Peer.ID)
			}
		}
	}
	res.Disagreed = append(res.Disagreed, sess.outsiders...)
	for j, r := range sess.rejected {
		if r {
			res.Rejected = append(res.Rejected, s.Members[j].Peer.ID)
		}
	}
	sess.mu.Unlock()
}

// errImplausible marks an answered mean refused by the norm check.
var errImplausible = errors.New("implausible mean")

// sendPart sends this member's chunks of reducer j's part and writes the
// averages it answers into part. It stops at the first failure, leaving the
// remaining chunks local, except that a refused (implausible) answer only
// leaves its own chunk local.
func (a *Averager) sendPart(ctx context.Context, sess *session, j int, to peer.AddrInfo, part []float32, sent, recv *atomic.Int64) error {
	nc := numChunks(len(part), a.cfg.ChunkElems)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var next atomic.Int64
	var once sync.Once
	var firstErr error
	var wg sync.WaitGroup
	for range min(a.cfg.Window, nc) {
		wg.Go(func() {
			for {
				i := int(next.Add(1) - 1)
				if i >= nc || ctx.Err() != nil {
					return
				}
				lo := i * a.cfg.ChunkElems
				hi := min(lo+a.cfg.ChunkElems, len(part))
				if err := a.exchange(ctx, sess, j, i, to, part[lo:hi], sent, recv); err != nil {
					if errors.Is(err, errImplausible) {
						// This chunk keeps our values, but the reducer
						// still gets the rest of our part: stopping would
						// make an honest reducer wait ReduceWait for it.
						once.Do(func() { firstErr = err })
						continue
					}
					once.Do(func() { firstErr = err; cancel() })
					return
				}
			}
		})
	}
	wg.Wait()
	return firstErr
}

// exchange sends one chunk to its reducer and stores the answered mean.
func (a *Averager) exchange(ctx context.Context, sess *session, j, i int, to peer.AddrInfo, x []float32, sent, recv *atomic.Int64) error {
	req := reduceRequest{
		Session: sess.id, Hash: sess.hash, Sender: uint16(sess.self), Size: uint16(len(sess.members)),
		Part: uint16(j), Chunk: uint32(i),
	}
	b, err := appendVector(req.appendHeader(make([]byte, 0, reduceHeader+len(sess.id)+encodedLen(len(x), a.cfg.Codec))), x, a.cfg.Codec)
	if err != nil {
		return fmt.Errorf("averaging: encode chunk: %w", err)
	}
	sent.Add(int64(len(b)))
	resp, err := a.t.Call(ctx, to, ReduceProtocol, b)
	var remote *p2p.RemoteError
	if err != nil && ctx.Err() == nil && !errors.As(err, &remote) {
		// A transport failure (a dial or stream lost, e.g. two hosts
		// connecting to each other at once) gets one more try: the
		// reducer ignores a chunk it already has, so resending is safe.
		if clock.Sleep(ctx, 50*time.Millisecond) == nil {
			resp, err = a.t.Call(ctx, to, ReduceProtocol, b)
		}
	}
	// A reducer whose table of pending sessions is full (flooded by
	// others, or this peer is early) is asked again until it has joined,
	// for as long as it would have held the chunk waiting (ReduceWait).
	giveUp := time.Now().Add(a.cfg.ReduceWait)
	for wait := 20 * time.Millisecond; err != nil && errors.As(err, &remote) && strings.Contains(remote.Msg, errPending.Error()); wait = min(2*wait, time.Second) {
		if time.Now().Add(wait).After(giveUp) || clock.Sleep(ctx, wait) != nil {
			break
		}
		resp, err = a.t.Call(ctx, to, ReduceProtocol, b)
	}
	if err != nil {
		return fmt.Errorf("averaging: reduce chunk %d at %s: %w", i, to.ID.ShortString(), err)
	}
	recv.Add(int64(len(resp)))
	_, p, err := unmarshalReduceResponse(resp, len(sess.members))
	if err != nil {
		return err
	}
	// Decode into a recycled buffer, so that a bad answer leaves our own
	// values in place.
	mean := getScratch(len(x))
	defer putScratch(mean)
	ss, err := decodeInto(p, *mean)
	if err != nil {
		return err
	}
	if g := a.cfg.MaxNormRatio; g > 0 {
		// Our own chunk's norm, or our vector's RMS scaled to the chunk if
		// larger (a chunk of our values may be near zero). The chunk's own
		// norm is only computed when the floor alone does not pass it.
		got := math.Sqrt(ss)
		select {
		case <-sess.rmsReady:
		case <-ctx.Done():
			return ctx.Err()
		}
		own := sess.rms * math.Sqrt(float64(len(x)))
		if got > g*own {
			own = max(own, Norm(x))
		}
		if own > 0 && got > g*own {
			return fmt.Errorf("%w: %w: mean of chunk %d from %s has norm %.3g, %.3g× ours", ErrMessage, errImplausible, i, to.ID.ShortString(), got, got/own)
		}
	}
	copy(x, *mean)
	return nil
}
