// The reducer side of the all-reduce: the state of a session this peer
// reduces a part of, the contributions it accumulates, and the rules that
// stop waiting for members that are silent, stalled, disagreeing or gone.

package averaging

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"slices"
	"sync"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/skyhive/skyhive/tensor"
	"github.com/skyhive/skyhive/wire"
)

// session is the reducer-side state of one all-reduce.
type session struct {
	id      string
	joined  chan struct{} // closed by join
	expires time.Time     // forgotten after this; guarded by the Averager's mu
	// owner announced the session before this peer joined it; pending is
	// set while it counts against owner's share. Guarded by the Averager's mu.
	owner   peer.ID
	pending bool

	// left records leave and decline notices that arrived before this
	// peer joined; guarded by the Averager's mu.
	left map[peer.ID]leaveNotice
	// declined is set when this peer declines the session (Decline) and
	// gone is closed then, so that chunks waiting for a join are refused
	// at once; declined is guarded by the Averager's mu.
	declined bool
	gone     chan struct{}

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
	declinedBy  []bool      // members that declined the session (a decline notice)
	disagreed   []bool      // members that joined it with another member list
	// outsiders are peers not listed here that sent chunks of the session
	// with another member list (they list this peer), at most
	// maxOutsiders.
	outsiders []peer.ID
	// quiet is how long a member may send nothing before ban counts it as
	// stalled (ReduceWait/2); set before joined is closed.
	quiet time.Duration
	// agg is how chunks are aggregated; set before joined is closed.
	agg aggregator
	// rejected marks members whose contribution to a chunk was dropped by
	// the norm check.
	rejected []bool
	// rms is the RMS of this peer's vector, the floor of the answer check.
	// AllReduce computes it while the first chunks travel and closes
	// rmsReady when it is set; nothing writes the vector before that.
	rms      float64
	rmsReady chan struct{}
	// ownPart is this peer's part of its vector, and partRMS its RMS,
	// computed under mu the first time a contribution fails the median
	// check (partRMS < 0 until then): the floor of that check, so that a
	// chunk one member left near zero (a sparse gradient: embedding rows
	// its batch did not touch) does not make the others' look hostile.
	ownPart []float32
	partRMS float64
}

// chunk accumulates the contributions to one chunk of the reducer's part.
type chunk struct {
	sum   []float32 // becomes the mean at finalization
	from  []bool
	count int
	resp  []byte // the response: contributor count and encoded mean, set at finalization
	done  chan struct{}
	// own is this peer's contribution (a view of the caller's vector,
	// which AllReduce does not write before the chunk is final); contrib
	// holds the other members' decoded contributions and norm every
	// contribution's norm, kept until finalization when the norm check or
	// a robust aggregation needs them.
	own     []float32
	contrib []*[]float32
	norm    []float64
}

// errPending is what a reducer answers when the sender may not announce
// more sessions here now (its share or the table of pending sessions is
// full); honest senders retry until the session is joined here.
var errPending = errors.New("averaging: too many pending sessions")

// errDisagree is what a reducer answers a chunk whose sender joined the
// session with another member list or other settings.
var errDisagree = errors.New("member list or settings differ")

// announce returns the session with the given ID, creating a pending
// (not yet joined) one on behalf of from if from's share and the table
// allow: a peer holds at most MaxPendingPerPeer pending sessions and all
// peers together at most MaxSessions/2, so strangers and sybils cannot
// fill the table or stop this peer from joining its own sessions.
func (a *Averager) announce(id string, from peer.ID) (*session, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.closed {
		return nil, ErrClosed
	}
	if s, ok := a.sessions[id]; ok {
		return s, nil
	}
	now := a.now()
	a.sweepLocked(now, false)
	if a.pending[from] >= a.cfg.MaxPendingPerPeer || a.npending >= a.cfg.MaxSessions/2 {
		a.sweepLocked(now, true)
		if a.pending[from] >= a.cfg.MaxPendingPerPeer || a.npending >= a.cfg.MaxSessions/2 {
			a.refused.Add(1)
			return nil, fmt.Errorf("%w: %d here, %d of them %s's", errPending, a.npending, a.pending[from], from.ShortString())
		}
	}
	s := &session{id: id, owner: from, pending: true, joined: make(chan struct{}), gone: make(chan struct{}), expires: now.Add(a.cfg.ReduceWait)}
	a.sessions[id] = s
	a.pending[from]++
	a.npending++
	return s, nil
}

// sweepLocked forgets expired sessions (every ReduceWait/4 at most, or now
// if force is set); a.mu must be held.
func (a *Averager) sweepLocked(now time.Time, force bool) {
	if !force && now.Before(a.nextSweep) {
		return
	}
	a.nextSweep = now.Add(a.cfg.ReduceWait / 4)
	for k, s := range a.sessions {
		if now.After(s.expires) {
			a.deleteLocked(k, s)
		}
	}
}

// deleteLocked removes a session from the table; a.mu must be held.
func (a *Averager) deleteLocked(id string, s *session) {
	delete(a.sessions, id)
	a.unpendLocked(s)
}

// unpendLocked stops counting s as pending; a.mu must be held.
func (a *Averager) unpendLocked(s *session) {
	if !s.pending {
		return
	}
	s.pending = false
	a.npending--
	if a.pending[s.owner]--; a.pending[s.owner] <= 0 {
		delete(a.pending, s.owner)
	}
}

// finish releases a session this peer's AllReduce is done with: every
// chunk is finalized (so no handler waits on it), the timers stop, the
// contributions are freed, and the session is forgotten after ReduceWait
// (late members still get the final means meanwhile).
func (a *Averager) finish(sess *session) {
	sess.stop()
	sess.ban(true)
	sess.mu.Lock()
	for _, c := range sess.chunks {
		c.sum, c.contrib = nil, nil
	}
	sess.mu.Unlock()
	a.mu.Lock()
	sess.expires = a.now().Add(a.cfg.ReduceWait)
	a.mu.Unlock()
}

// join sets up this peer's reducer state and adds its own contribution.
func (a *Averager) join(s Session, self int, bounds []int, vec []float32) (*session, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.closed {
		return nil, ErrClosed
	}
	now := a.now()
	sess, err := a.ownSessionLocked(s.ID, now)
	if err != nil {
		return nil, err
	}
	a.unpendLocked(sess)
	sess.hash = s.hash(a.cfg, len(vec))
	sess.self = self
	sess.members = make([]peer.ID, len(s.Members))
	for i, m := range s.Members {
		sess.members[i] = m.Peer.ID
	}
	sess.lo, sess.hi = bounds[self], bounds[self+1]
	sess.ownPart, sess.partRMS = vec[sess.lo:sess.hi], -1
	sess.codec = a.cfg.Codec
	sess.contributed = make([]bool, len(s.Members))
	sess.banned = make([]bool, len(s.Members))
	sess.declinedBy = make([]bool, len(s.Members))
	sess.disagreed = make([]bool, len(s.Members))
	sess.contributed[self] = true
	sess.lastSeen = make([]time.Time, len(s.Members))
	sess.quiet = a.cfg.ReduceWait / 2
	sess.agg = a.aggregator()
	sess.rejected = make([]bool, len(s.Members))
	sess.expires = now.Add(a.cfg.Timeout + a.cfg.ReduceWait)
	n := sess.hi - sess.lo
	sess.chunks = make([]*chunk, numChunks(n, a.cfg.ChunkElems))
	for i := range sess.chunks {
		lo := sess.lo + i*a.cfg.ChunkElems
		hi := min(lo+a.cfg.ChunkElems, sess.hi)
		c := &chunk{sum: append([]float32(nil), vec[lo:hi]...), from: make([]bool, len(s.Members)), count: 1, done: make(chan struct{})}
		c.from[self] = true
		if sess.agg.retain() {
			c.own = vec[lo:hi]
			c.contrib = make([]*[]float32, len(s.Members))
			c.norm = make([]float64, len(s.Members))
		}
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
		if l, ok := sess.left[id]; ok && l.Hash == sess.hash && j != self {
			sess.banned[j] = true // it left or declined before we joined
			sess.declinedBy[j] = l.Decline
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

// ownSessionLocked returns the session id for this peer to join or
// decline, making one (and room for it) if no member announced it yet; it
// fails if this peer already joined or declined it. a.mu must be held.
func (a *Averager) ownSessionLocked(id string, now time.Time) (*session, error) {
	sess := a.sessions[id]
	if sess == nil {
		// This peer's own sessions come first: make room by forgetting
		// expired ones, then the oldest pending one.
		a.sweepLocked(now, len(a.sessions) >= a.cfg.MaxSessions)
		if len(a.sessions) >= a.cfg.MaxSessions {
			var old *session
			for _, x := range a.sessions {
				if x.pending && (old == nil || x.expires.Before(old.expires)) {
					old = x
				}
			}
			if old == nil {
				return nil, fmt.Errorf("averaging: too many sessions (%d)", len(a.sessions))
			}
			a.deleteLocked(old.id, old)
		}
		sess = &session{id: id, joined: make(chan struct{}), gone: make(chan struct{})}
		a.sessions[id] = sess
	}
	if sess.declined {
		return nil, fmt.Errorf("%w: %s", ErrDeclined, id)
	}
	select {
	case <-sess.joined:
		return nil, fmt.Errorf("%w: %s", ErrJoined, id)
	default:
	}
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

// Why a reducer stops waiting for a member (session.drop).
type dropReason int

const (
	dropBad       dropReason = iota // a malformed or non-finite contribution
	dropLeft                        // a leave notice: it stopped
	dropDeclined                    // a decline notice: it is busy
	dropDisagreed                   // it joined with another member list or settings
)

// maxOutsiders bounds session.outsiders.
const maxOutsiders = 16

// drop stops waiting for the member id (if listed), for the reason given;
// an unlisted peer that disagrees is remembered as an outsider.
func (s *session) drop(id peer.ID, why dropReason) {
	j := slices.Index(s.members, id)
	if j < 0 && why == dropDisagreed {
		s.mu.Lock()
		if len(s.outsiders) < maxOutsiders && !slices.Contains(s.outsiders, id) {
			s.outsiders = append(s.outsiders, id)
		}
		s.mu.Unlock()
	}
	if j < 0 || j == s.self {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	switch why {
	case dropDeclined:
		s.declinedBy[j] = !s.contributed[j]
	case dropDisagreed:
		s.disagreed[j] = true
	}
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
	s.aggregate(c)
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

// add adds a member's contribution unless the chunk is final or already
// has it.
func (s *session) add(c *chunk, sender int, x []float32) {
	s.addOwned(c, sender, &x, Norm(x))
}

// addOwned is add for a buffer from getScratch whose norm the caller has
// computed (outside the lock). It reports whether the chunk keeps x until
// finalization (the caller must then not reuse it).
func (s *session) addOwned(c *chunk, sender int, x *[]float32, norm float64) (kept bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.contributed[sender] = true
	s.lastSeen[sender] = time.Now()
	if c.resp != nil || c.from[sender] {
		return false
	}
	c.from[sender] = true
	c.count++
	tensor.Axpy(1, *x, c.sum)
	if c.contrib != nil {
		c.contrib[sender] = x
		c.norm[sender] = norm
		kept = true
	}
	s.maybeFinalize(c, false)
	return kept
}

// wait waits for the chunk to be final; the session's timers guarantee it
// is by the final deadline.
func (c *chunk) wait(ctx context.Context, closed <-chan struct{}) error {
	select {
	case <-c.done:
		return nil // final: answer it even if the averager is closing
	default:
	}
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
	s, err := a.announce(r.Session, from)
	if err != nil {
		return nil, err
	}
	select {
	case <-s.joined:
	case <-s.gone:
		return nil, fmt.Errorf("%w: %s", ErrDeclined, r.Session)
	default:
		// Not joined here yet: wait, holding the request, at most
		// ReduceWait and for at most MaxPendingPerPeer·Window requests of
		// this sender at once.
		if !a.holdWait(from) {
			return nil, fmt.Errorf("%w: %s has too many waiting chunks", errPending, from.ShortString())
		}
		defer a.releaseWait(from)
		t := time.NewTimer(a.cfg.ReduceWait)
		defer t.Stop()
		select {
		case <-s.joined:
		case <-s.gone:
			return nil, fmt.Errorf("%w: %s", ErrDeclined, r.Session)
		case <-t.C:
			return nil, fmt.Errorf("averaging: session %q not joined here within %v", r.Session, a.cfg.ReduceWait)
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-a.done:
			return nil, ErrClosed
		}
	}
	switch {
	case r.Hash != s.hash || int(r.Size) != len(s.members):
		// Intersect: a listed member that disagrees on the member list
		// will never contribute to this session; stop waiting for it.
		s.drop(from, dropDisagreed)
		return nil, fmt.Errorf("averaging: session %q: %w", r.Session, errDisagree)
	case int(r.Part) != s.self:
		return nil, fmt.Errorf("averaging: session %q: part %d is not reduced here", r.Session, r.Part)
	case s.members[r.Sender] != from || int(r.Sender) == s.self:
		return nil, fmt.Errorf("averaging: session %q: sender is not member %d", r.Session, r.Sender)
	case int(r.Chunk) >= len(s.chunks):
		return nil, fmt.Errorf("averaging: session %q: chunk %d of %d", r.Session, r.Chunk, len(s.chunks))
	}
	c := s.chunks[r.Chunk]
	// The length is the one this peer derived from its own vector; the
	// payload must match it exactly before anything is decoded.
	want := min(a.cfg.ChunkElems, s.hi-s.lo-int(r.Chunk)*a.cfg.ChunkElems)
	x := getScratch(want)
	ss, err := decodeInto(r.Payload, *x)
	if err != nil {
		// A malformed or non-finite contribution: stop waiting for this
		// member, as for one that disagrees.
		putScratch(x)
		s.drop(from, dropBad)
		return nil, err
	}
	if !s.addOwned(c, int(r.Sender), x, math.Sqrt(ss)) {
		putScratch(x)
	}
	if err := c.wait(ctx, a.done); err != nil {
		return nil, err
	}
	// c.resp is immutable once done is closed; callers only read it.
	return c.resp, nil
}

// holdWait counts a request of from waiting for a join, if from's share
// allows it.
func (a *Averager) holdWait(from peer.ID) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.waiting[from] >= a.cfg.MaxPendingPerPeer*a.cfg.Window {
		a.refused.Add(1)
		return false
	}
	a.waiting[from]++
	return true
}

func (a *Averager) releaseWait(from peer.ID) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.waiting[from]--; a.waiting[from] <= 0 {
		delete(a.waiting, from)
	}
}

// handleLeave stops waiting for a member that left a joined session.
func (a *Averager) handleLeave(_ context.Context, from peer.ID, req []byte) ([]byte, error) {
	l, err := unmarshalLeave(req)
	if err != nil {
		return nil, err
	}
	s, err := a.announce(l.Session, from)
	if err != nil {
		return nil, err
	}
	a.mu.Lock()
	select {
	case <-s.joined:
		a.mu.Unlock()
		if s.hash == l.Hash {
			why := dropLeft
			if l.Decline {
				why = dropDeclined
			}
			s.drop(from, why)
		}
	default:
		// Not joined here yet: remember it for the join (bounded by the
		// session's member count there, and by MaxSessions here).
		if s.left == nil {
			s.left = map[peer.ID]leaveNotice{}
		}
		if len(s.left) < MaxGroupSize {
			s.left[from] = l
		}
		a.mu.Unlock()
	}
	return nil, nil
}
