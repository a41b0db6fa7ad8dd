// Package hostile is the hostile peer: requests against every Skyhive
// protocol that an honest victim must refuse or absorb, built as bytes and
// sent over p2p (poisoned gradients and contributions, shape and length
// claims, forged and far-future DHT records, session squatting, strangers'
// control calls, slow senders), and a paced flood that sends them from many
// identities and tallies the victims' verdicts. `skyhive attack` runs it
// against real processes, `skyhive bench hostile` measures what it costs
// honest peers, and the tests of both assert that nothing was accepted.
package hostile

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/skyhive/skyhive/p2p"
)

// Attack is one kind of hostile request. Send sends one from h and returns
// the victim's answer: nil if the victim accepted it, an error (such as a
// *p2p.RemoteError, a reset stream or ErrNotAccepted) if it refused it.
type Attack struct {
	Name string
	Send func(ctx context.Context, h *p2p.Host) error
	// Bytes is the size of one request, about (for the flood's byte rate).
	Bytes int
	// Absorbed marks a request that an honest peer may also send (a DHT
	// record within the quota, a worker's registration): the victim may
	// accept it, and what the attack tests is that its cost stays bounded,
	// not that it is refused.
	Absorbed bool
	// Timeout bounds one request instead of Flood.CallTimeout (slow
	// senders need longer to be cut off).
	Timeout time.Duration
	// Victim is the peer every request goes to, if there is one (attacks
	// that pick a victim per request leave it empty). A request to a
	// victim that had told this identity it is blocked, and that fails or
	// is held, counts as refused (AttackTally.Blocked).
	Victim peer.ID
}

// toVictim sets the Victim of every attack in as to v and returns as.
func toVictim(v peer.ID, as []Attack) []Attack {
	for i := range as {
		as[i].Victim = v
	}
	return as
}

// ErrNotAccepted is a victim's refusal that came as a normal answer (a DHT
// node answering a STORE with "not accepted").
var ErrNotAccepted = errors.New("hostile: the victim did not accept the request")

// ErrNotApplicable is returned by an attack that found nothing to attack
// at its victim (an erasure of a dictionary the node does not hold): it is
// counted as inapplicable, neither refused nor accepted.
var ErrNotApplicable = errors.New("hostile: nothing to attack at this victim")

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

	mu       sync.Mutex
	tally    map[string]*AttackTally
	told     map[[2]peer.ID]bool // (identity, victim): the victim said it blocked the identity
	launched int64
	skipped  int64
	elapsed  time.Duration
}

// AttackTally counts the verdicts on one kind of request.
type AttackTally struct {
	// Sent counts requests whose verdict arrived (or timed out) before the
	// flood stopped.
	Sent int64 `json:"sent"`
	// Refused counts requests answered with an error or a reset stream,
	// and those held or failed after the victim had told the sending
	// identity that it is blocked.
	Refused int64 `json:"refused"`
	// Blocked counts those of Refused that went to a victim that had
	// blocked the sending identity: it reads none of them (see
	// p2p.Host.BlockList), so they wait in the attacker's own buffers.
	Blocked int64 `json:"blocked,omitempty"`
	// Unanswered counts requests the victim held past CallTimeout.
	Unanswered int64 `json:"unanswered"`
	// Accepted counts requests the victim answered as valid.
	Accepted int64 `json:"accepted"`
	// Inapplicable counts attempts that found nothing to attack
	// (ErrNotApplicable).
	Inapplicable int64 `json:"inapplicable,omitempty"`
	// Bytes sums the sizes of the requests sent.
	Bytes int64 `json:"bytes"`
	// Absorbed is the Attack's Absorbed: its requests may be accepted.
	Absorbed bool `json:"absorbed,omitempty"`
}

func (t *AttackTally) add(o AttackTally) {
	t.Sent += o.Sent
	t.Refused += o.Refused
	t.Blocked += o.Blocked
	t.Unanswered += o.Unanswered
	t.Accepted += o.Accepted
	t.Inapplicable += o.Inapplicable
	t.Bytes += o.Bytes
}

// FloodTally sums a flood's verdicts over all the times it ran.
type FloodTally struct {
	AttackTally
	// ByAttack breaks the counts down by Attack.Name.
	ByAttack map[string]AttackTally `json:"by_attack"`
	// Launched counts the requests started; Skipped the ticks skipped
	// because MaxInflight requests were awaiting their verdicts.
	Launched int64 `json:"launched"`
	Skipped  int64 `json:"skipped"`
	// Seconds is the time the flood sent (not the wait for the last
	// verdicts); Rate is Launched/Seconds, the
	// requests per second the attacker started.
	Seconds float64 `json:"seconds"`
	Rate    float64 `json:"rate"`
}

// Run floods until ctx ends and returns once every request in flight has
// ended (those cut short by ctx get no verdict). It may be called again;
// the tallies accumulate.
func (f *Flood) Run(ctx context.Context) { f.run(ctx, ctx) }

// RunFor sends requests for d, then waits for the verdicts of those in
// flight (each bounded by its timeout), all within ctx.
func (f *Flood) RunFor(ctx context.Context, d time.Duration) {
	sctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	f.run(sctx, ctx)
}

// run sends requests until send ends, each within reqs.
func (f *Flood) run(send, reqs context.Context) {
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
	var skipped, launched int64
	for i := 0; ; i++ {
		a := f.Attacks[i%len(f.Attacks)]
		h := f.Hosts[(i/len(f.Attacks))%len(f.Hosts)]
		select {
		case sem <- struct{}{}:
			launched++
			wg.Go(func() {
				defer func() { <-sem }()
				d := timeout
				if a.Timeout > 0 {
					d = a.Timeout
				}
				cctx, cancel := context.WithTimeout(reqs, d)
				err := a.Send(cctx, h)
				timedOut := cctx.Err() != nil
				cancel()
				if reqs.Err() == nil {
					f.count(a, h.ID(), err, timedOut)
				}
			})
		default:
			skipped++
		}
		select {
		case <-tick.C:
		case <-send.Done():
			elapsed := time.Since(start) // the sending, not the wait for verdicts
			wg.Wait()
			f.mu.Lock()
			f.elapsed += elapsed
			f.skipped += skipped
			f.launched += launched
			f.mu.Unlock()
			return
		}
	}
}

// count records the verdict on one request of a sent by identity from.
func (f *Flood) count(a Attack, from peer.ID, err error, timedOut bool) {
	name := a.Name
	v := AttackTally{Sent: 1, Bytes: int64(a.Bytes), Absorbed: a.Absorbed}
	f.mu.Lock()
	defer f.mu.Unlock()
	switch {
	case errors.Is(err, ErrNotApplicable):
		v.Inapplicable = 1
	case err == nil:
		v.Accepted = 1
	case a.Victim != "" && f.told[[2]peer.ID{from, a.Victim}]:
		v.Refused, v.Blocked = 1, 1
	case timedOut && !isRemote(err):
		v.Unanswered = 1
	default:
		// An error answer, or a stream or connection the victim reset.
		v.Refused = 1
	}
	if re := (*p2p.RemoteError)(nil); errors.As(err, &re) && strings.Contains(re.Msg, "blocked") {
		if f.told == nil {
			f.told = map[[2]peer.ID]bool{}
		}
		f.told[[2]peer.ID{from, re.Peer}] = true
	}
	if f.tally == nil {
		f.tally = map[string]*AttackTally{}
	}
	if f.tally[name] == nil {
		f.tally[name] = &AttackTally{Absorbed: a.Absorbed}
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
	t := FloodTally{ByAttack: map[string]AttackTally{}, Launched: f.launched, Skipped: f.skipped, Seconds: f.elapsed.Seconds()}
	for name, a := range f.tally {
		t.ByAttack[name] = *a
		t.add(*a)
	}
	if t.Seconds > 0 {
		t.Rate = float64(t.Launched) / t.Seconds
	}
	return t
}

// Breaches lists the attacks that are not Absorbed of which the victims
// accepted at least one request, sorted: what should never happen.
func (t FloodTally) Breaches() []string {
	var out []string
	for n, a := range t.ByAttack {
		if a.Accepted > 0 && !a.Absorbed {
			out = append(out, n)
		}
	}
	sort.Strings(out)
	return out
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
		if a.Blocked > 0 {
			fmt.Fprintf(&b, " (%d blocked)", a.Blocked)
		}
		if a.Unanswered > 0 {
			fmt.Fprintf(&b, ", %d held", a.Unanswered)
		}
		switch {
		case a.Accepted > 0 && a.Absorbed:
			fmt.Fprintf(&b, ", %d absorbed", a.Accepted)
		case a.Accepted > 0:
			fmt.Fprintf(&b, ", %d ACCEPTED", a.Accepted)
		}
	}
	return b.String()
}
