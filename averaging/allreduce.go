package averaging

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/fnv"
	"math"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/skyhive/skyhive/p2p"
	"github.com/skyhive/skyhive/tensor"
	"github.com/skyhive/skyhive/wire"
)

// Defaults of Config.
const (
	DefaultChunkElems = 1 << 18 // 1 MiB of float32 per message
	DefaultWindow     = 4
	DefaultTimeout    = 30 * time.Second
	DefaultMaxSession = 256
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
	// announced by a member's first message (256).
	MaxSessions int
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
	// died, stalled or rejected the session); that part of the vector keeps
	// this member's own values.
	Failed []peer.ID
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

	mu       sync.Mutex
	closed   bool
	sessions map[string]*session
}

// session is the reducer-side state of one all-reduce.
type session struct {
	id      string
	joined  chan struct{} // closed by join
	expires time.Time     // forgotten after this

	// left records leave notices that arrived before this peer joined
	// (member → member-list hash); guarded by the Averager's mu.
	left map[peer.ID]uint64

	// Set before joined is closed, read-only afterwards.
	hash    uint64
	members []peer.ID
	self    int
	lo, hi  int
	codec   wire.Codec
	chunks  []*chunk
	timers  []*time.Timer

	// Guarded by mu, like every chunk's state.
	mu          sync.Mutex
	contributed []bool      // sent at least one chunk
	lastSeen    []time.Time // when each member's latest chunk arrived
	banned      []bool      // no longer waited for
	// quiet is how long a member may send nothing before ban counts it as
	// stalled (ReduceWait/2); set before joined is closed.
	quiet time.Duration
}

// chunk accumulates the contributions to one chunk of the reducer's part.
type chunk struct {
	sum   []float32 // becomes the mean at finalization
	from  []bool
	count int
	resp  []byte // the response: contributor count and encoded mean, set at finalization
	done  chan struct{}
}

// New returns an Averager on t and registers its handler.
func New(t p2p.Transport, cfg Config) *Averager {
	a := &Averager{t: t, cfg: cfg.withDefaults(), done: make(chan struct{}), sessions: map[string]*session{}}
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
	}
	return nil
}

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

// lookup returns the session with the given ID, creating an unjoined one if
// create is set and there is room.
func (a *Averager) lookup(id string, create bool) (*session, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.closed {
		return nil, ErrClosed
	}
	if s, ok := a.sessions[id]; ok {
		return s, nil
	}
	if !create {
		return nil, nil
	}
	now := time.Now()
	if len(a.sessions) >= a.cfg.MaxSessions {
		for k, s := range a.sessions {
			if now.After(s.expires) {
				delete(a.sessions, k)
			}
		}
		if len(a.sessions) >= a.cfg.MaxSessions {
			return nil, fmt.Errorf("averaging: too many sessions (%d)", len(a.sessions))
		}
	}
	s := &session{id: id, joined: make(chan struct{}), expires: now.Add(a.cfg.ReduceWait)}
	a.sessions[id] = s
	return s, nil
}

// join sets up this peer's reducer state and adds its own contribution.
func (a *Averager) join(s Session, self int, bounds []int, vec []float32) (*session, error) {
	sess, err := a.lookup(s.ID, true)
	if err != nil {
		return nil, err
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	select {
	case <-sess.joined:
		return nil, fmt.Errorf("%w: %s", ErrJoined, s.ID)
	default:
	}
	now := time.Now()
	sess.hash = s.hash(a.cfg, len(vec))
	sess.self = self
	sess.members = make([]peer.ID, len(s.Members))
	for i, m := range s.Members {
		sess.members[i] = m.Peer.ID
	}
	sess.lo, sess.hi = bounds[self], bounds[self+1]
	sess.codec = a.cfg.Codec
	sess.contributed = make([]bool, len(s.Members))
	sess.banned = make([]bool, len(s.Members))
	sess.contributed[self] = true
	sess.lastSeen = make([]time.Time, len(s.Members))
	sess.quiet = a.cfg.ReduceWait / 2
	sess.expires = now.Add(a.cfg.Timeout + a.cfg.ReduceWait)
	n := sess.hi - sess.lo
	sess.chunks = make([]*chunk, numChunks(n, a.cfg.ChunkElems))
	for i := range sess.chunks {
		lo := sess.lo + i*a.cfg.ChunkElems
		hi := min(lo+a.cfg.ChunkElems, sess.hi)
		c := &chunk{sum: append([]float32(nil), vec[lo:hi]...), from: make([]bool, len(s.Members)), count: 1, done: make(chan struct{})}
		c.from[self] = true
		sess.chunks[i] = c
	}
	// Members that sent nothing within ReduceWait are dropped; the others
	// are waited for until the final deadline, which leaves time for the
	// answers to travel before the senders' Timeout.
	final := (a.cfg.Timeout + a.cfg.ReduceWait) / 2
	sess.timers = []*time.Timer{
		time.AfterFunc(a.cfg.ReduceWait, func() { sess.ban(false) }),
		time.AfterFunc(final, func() { sess.ban(true) }),
	}
	for j, id := range sess.members {
		if h, ok := sess.left[id]; ok && h == sess.hash && j != self {
			sess.banned[j] = true // it left before we joined
		}
	}
	sess.mu.Lock()
	for _, c := range sess.chunks {
		sess.maybeFinalize(c, false)
	}
	sess.mu.Unlock()
	if len(s.Members) == 1 {
		sess.ban(true)
	}
	close(sess.joined)
	return sess, nil
}

// ban stops waiting for members that have sent nothing or have stalled (or,
// if all is set, for every missing contribution) and finalizes the chunks
// that are then complete. A member has stalled if it has sent nothing for
// s.quiet and is missing from a chunk that some other member, and every
// member still sending, has contributed to: it died partway, and without the ban its absence would
// hold those chunks, and through the senders' windows all later ones,
// until the final deadline.
func (s *session) ban(all bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	quiet := make([]bool, len(s.banned))
	now := time.Now()
	for j := range s.banned {
		if all || !s.contributed[j] {
			s.banned[j] = true
		}
		quiet[j] = j != s.self && !s.banned[j] && now.Sub(s.lastSeen[j]) >= s.quiet
	}
	for _, c := range s.chunks {
		if c.resp != nil || c.count < 2 {
			continue // final, or no other member has sent it yet
		}
		waiting := false // for a member that is still sending
		for k, ok := range c.from {
			waiting = waiting || (!ok && !s.banned[k] && !quiet[k])
		}
		if waiting {
			continue
		}
		for k, ok := range c.from {
			if !ok && quiet[k] {
				s.banned[k] = true
			}
		}
	}
	for _, c := range s.chunks {
		s.maybeFinalize(c, all)
	}
}

// disagree stops waiting for the member id (if listed), which joined the
// session with another member list or other settings.
func (s *session) disagree(id peer.ID) {
	j := slices.Index(s.members, id)
	if j < 0 || j == s.self {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.banned[j] {
		return
	}
	s.banned[j] = true
	for _, c := range s.chunks {
		s.maybeFinalize(c, false)
	}
}

// stop releases the session's timers.
func (s *session) stop() {
	for _, t := range s.timers {
		t.Stop()
	}
}

// maybeFinalize turns the chunk's sum into the mean and encodes it, once,
// if every member has contributed or been banned (or force is set).
// s.mu must be held.
func (s *session) maybeFinalize(c *chunk, force bool) {
	if c.resp != nil {
		return
	}
	if !force {
		for j, ok := range c.from {
			if !ok && !s.banned[j] {
				return
			}
		}
	}
	tensor.Scale(1/float32(c.count), c.sum)
	b := make([]byte, 2, 2+encodedLen(len(c.sum), s.codec))
	binary.LittleEndian.PutUint16(b, uint16(c.count))
	out, err := appendVector(b, c.sum, s.codec)
	if err != nil {
		// Only 8-bit codecs fail, on non-finite input, which decodeInto
		// rejects; fall back to the lossless encoding rather than fail.
		out, _ = appendVector(b, c.sum, wire.CodecNone)
	}
	c.resp = out
	close(c.done)
}

// add adds a member's contribution unless the chunk is final or already has it.
func (s *session) add(c *chunk, sender int, x []float32) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.contributed[sender] = true
	s.lastSeen[sender] = time.Now()
	if c.resp != nil || c.from[sender] {
		return
	}
	c.from[sender] = true
	c.count++
	tensor.Axpy(1, x, c.sum)
	s.maybeFinalize(c, false)
}

// wait waits for the chunk to be final; the session's timers guarantee it
// is by the final deadline.
func (c *chunk) wait(ctx context.Context, closed <-chan struct{}) error {
	select {
	case <-c.done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	case <-closed:
		return ErrClosed
	}
}

func (a *Averager) handleReduce(ctx context.Context, from peer.ID, req []byte) ([]byte, error) {
	r, err := unmarshalReduceRequest(req)
	if err != nil {
		return nil, err
	}
	s, err := a.lookup(r.Session, true)
	if err != nil {
		return nil, err
	}
	t := time.NewTimer(a.cfg.ReduceWait)
	defer t.Stop()
	select {
	case <-s.joined:
	case <-t.C:
		return nil, fmt.Errorf("averaging: session %q not joined here within %v", r.Session, a.cfg.ReduceWait)
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-a.done:
		return nil, ErrClosed
	}
	switch {
	case r.Hash != s.hash || int(r.Size) != len(s.members):
		// Intersect: a listed member that disagrees on the member list
		// will never contribute to this session; stop waiting for it.
		s.disagree(from)
		return nil, fmt.Errorf("averaging: session %q: member list or settings differ", r.Session)
	case int(r.Part) != s.self:
		return nil, fmt.Errorf("averaging: session %q: part %d is not reduced here", r.Session, r.Part)
	case s.members[r.Sender] != from || int(r.Sender) == s.self:
		return nil, fmt.Errorf("averaging: session %q: sender is not member %d", r.Session, r.Sender)
	case int(r.Chunk) >= len(s.chunks):
		return nil, fmt.Errorf("averaging: session %q: chunk %d of %d", r.Session, r.Chunk, len(s.chunks))
	}
	c := s.chunks[r.Chunk]
	want := min(a.cfg.ChunkElems, s.hi-s.lo-int(r.Chunk)*a.cfg.ChunkElems)
	x := getScratch(want)
	err = decodeInto(r.Payload, *x)
	if err == nil {
		s.add(c, int(r.Sender), *x)
	}
	putScratch(x)
	if err != nil {
		return nil, err
	}
	if err := c.wait(ctx, a.done); err != nil {
		return nil, err
	}
	// c.resp is immutable once done is closed; callers only read it.
	return c.resp, nil
}

// handleLeave stops waiting for a member that left a joined session.
func (a *Averager) handleLeave(_ context.Context, from peer.ID, req []byte) ([]byte, error) {
	l, err := unmarshalLeave(req)
	if err != nil {
		return nil, err
	}
	s, err := a.lookup(l.Session, true)
	if err != nil {
		return nil, err
	}
	select {
	case <-s.joined:
		if s.hash == l.Hash {
			s.disagree(from)
		}
	default:
		// Not joined here yet: remember it for the join (bounded by the
		// session's member count there, and by MaxSessions here).
		a.mu.Lock()
		if s.left == nil {
			s.left = map[peer.ID]uint64{}
		}
		if len(s.left) < MaxGroupSize {
			s.left[from] = l.Hash
		}
		a.mu.Unlock()
	}
	return nil, nil
}

// leave tells the other members that this one stopped, best effort and
// briefly, so that they do not wait for it until ReduceWait.
func (a *Averager) leave(sess *session, members []Member) {
	ctx, cancel := context.WithTimeout(context.Background(), min(time.Second, a.cfg.ReduceWait))
	defer cancel()
	msg := leaveNotice{Session: sess.id, Hash: sess.hash}.marshal()
	var wg sync.WaitGroup
	for j, m := range members {
		if j != sess.self {
			wg.Go(func() { _, _ = a.t.Call(ctx, m.Peer, LeaveProtocol, msg) })
		}
	}
	wg.Wait()
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
	if len(s.ID) == 0 || len(s.ID) > MaxSessionLen {
		return res, fmt.Errorf("averaging: session ID of %d bytes", len(s.ID))
	}
	if len(s.Members) == 0 || len(s.Members) > MaxGroupSize {
		return res, fmt.Errorf("averaging: %d members", len(s.Members))
	}
	if len(vec) == 0 || len(vec) > a.cfg.MaxElements {
		return res, fmt.Errorf("averaging: vector of %d elements (limit %d)", len(vec), a.cfg.MaxElements)
	}
	self := -1
	weights := make([]float64, len(s.Members))
	seen := map[peer.ID]bool{}
	for i, m := range s.Members {
		if seen[m.Peer.ID] {
			return res, fmt.Errorf("averaging: member %s listed twice", m.Peer.ID)
		}
		seen[m.Peer.ID] = true
		if m.Peer.ID == a.t.ID() {
			self = i
		}
		weights[i] = m.Weight
	}
	if self < 0 {
		return res, ErrNotMember
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

	var sent, recv atomic.Int64
	failed := make([]bool, len(s.Members))
	var wg sync.WaitGroup
	for j := range s.Members {
		if j == self || bounds[j] == bounds[j+1] {
			continue
		}
		wg.Go(func() {
			if err := a.sendPart(ctx, sess, j, s.Members[j].Peer, vec[bounds[j]:bounds[j+1]], &sent, &recv); err != nil {
				failed[j] = true
			}
		})
	}

	// This member's own part.
	res.Contributors = len(s.Members)
	missing := make([]bool, len(s.Members))
	var ownErr error
	for i, c := range sess.chunks {
		if err := c.wait(ctx, a.done); err != nil {
			ownErr = err
			break
		}
		lo := sess.lo + i*a.cfg.ChunkElems
		sess.mu.Lock()
		// With compression use what the other members receive, so all
		// hold the same average.
		if a.cfg.Codec == wire.CodecNone || decodeInto(c.resp[2:], vec[lo:lo+len(c.sum)]) != nil {
			copy(vec[lo:], c.sum)
		}
		res.Contributors = min(res.Contributors, c.count)
		for j, ok := range c.from {
			missing[j] = missing[j] || !ok
		}
		sess.mu.Unlock()
	}
	wg.Wait()
	sess.stop()
	if errors.Is(ctx.Err(), context.Canceled) {
		a.leave(sess, s.Members) // stopped by the caller, not timed out
	}
	for j := range s.Members {
		if missing[j] {
			res.Missing = append(res.Missing, s.Members[j].Peer.ID)
		}
		if failed[j] {
			res.Failed = append(res.Failed, s.Members[j].Peer.ID)
		}
	}
	res.Sent, res.Received = sent.Load(), recv.Load()
	res.Elapsed = time.Since(start)
	if ownErr != nil {
		return res, fmt.Errorf("averaging: session %s: %w", s.ID, ownErr)
	}
	return res, nil
}

// sendPart sends this member's chunks of reducer j's part and writes the
// averages it answers into part. It stops at the first failure, leaving the
// remaining chunks local.
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
	if err := decodeInto(p, *mean); err != nil {
		return err
	}
	copy(x, *mean)
	return nil
}
