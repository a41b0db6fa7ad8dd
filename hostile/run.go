package hostile

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/skyhive/skyhive/p2p"
)

// defaultSlowIdentities is how many identities send the slow attacks
// unless RunConfig.SlowIdentities says otherwise.
const defaultSlowIdentities = 2

// RunConfig is one run of the hostile peer against real peers.
type RunConfig struct {
	// Targets are the peers to attack (required).
	Targets []peer.AddrInfo
	// NewHost starts one of the attacker's identities (required); Run
	// closes them.
	NewHost func(ctx context.Context) (*p2p.Host, error)
	// Identities is how many identities send the quick attacks (default
	// 4). Slow senders have identities of their own, so that a victim
	// must cut them off by its request deadline, not because another
	// attack from the same identity got it blocked.
	Identities int
	// SlowIdentities is how many identities of their own the slow senders
	// have (default 2); many of them can together hold more streams of a
	// protocol than libp2p lets one peer open.
	SlowIdentities int
	// Rate is the quick attacks' requests per second (default 100), and
	// SlowRate the slow senders started per second (default 1; negative:
	// none).
	Rate, SlowRate float64
	// Duration is how long the quick attacks run (default 30 s). Slow
	// senders start in its first half; the run then waits for their
	// verdicts, about 31 s after the last one started from a victim with
	// p2p's default timeouts (at most SlowTimeout).
	Duration time.Duration
	// MaxInflight bounds the quick requests awaiting a verdict (default
	// twice Rate, at least 64: requests held by a victim that blocked the
	// identity wait up to a second each).
	MaxInflight int
}

// Report is what a run found.
type Report struct {
	Targets []Target `json:"targets"`
	// Fast tallies the quick attacks, Slow the slow senders.
	Fast FloodTally `json:"fast"`
	Slow FloodTally `json:"slow"`
	// Breaches lists the attacks (not Absorbed) of which a victim accepted
	// a request, and slow senders a victim held to the end: empty if every
	// defence held.
	Breaches []string `json:"breaches"`
}

// Run surveys the targets, then floods them with every attack that fits
// the roles they play, from Identities identities, for Duration.
func Run(ctx context.Context, c RunConfig) (Report, error) {
	if len(c.Targets) == 0 {
		return Report{}, errors.New("hostile: no targets")
	}
	if c.NewHost == nil {
		return Report{}, errors.New("hostile: RunConfig.NewHost is required")
	}
	if c.Identities <= 0 {
		c.Identities = 4
	}
	if c.Rate <= 0 {
		c.Rate = 100
	}
	if c.SlowRate == 0 {
		c.SlowRate = 1
	}
	if c.Duration <= 0 {
		c.Duration = 30 * time.Second
	}
	if c.SlowIdentities <= 0 {
		c.SlowIdentities = defaultSlowIdentities
	}
	if c.MaxInflight <= 0 {
		c.MaxInflight = max(64, int(2*c.Rate))
	}
	hosts := make([]*p2p.Host, 0, c.Identities+c.SlowIdentities)
	defer func() {
		for _, h := range hosts {
			h.Close()
		}
	}()
	for range c.Identities + c.SlowIdentities {
		h, err := c.NewHost(ctx)
		if err != nil {
			return Report{}, fmt.Errorf("hostile: identity: %w", err)
		}
		hosts = append(hosts, h)
	}
	targets, err := Survey(ctx, hosts[0], c.Targets)
	if err != nil {
		return Report{}, err
	}
	fast, slow := Attacks(targets)
	if len(fast) == 0 {
		return Report{Targets: targets}, errors.New("hostile: the targets speak no protocol there is an attack for")
	}
	ff := &Flood{Hosts: hosts[:c.Identities], Attacks: fast, Rate: c.Rate, MaxInflight: c.MaxInflight}
	sf := &Flood{Hosts: hosts[c.Identities:], Attacks: slow, Rate: c.SlowRate, MaxInflight: max(c.MaxInflight, int(c.SlowRate*SlowTimeout.Seconds())+1)}
	var wg sync.WaitGroup
	wg.Go(func() { ff.RunFor(ctx, c.Duration) })
	if c.SlowRate > 0 && len(slow) > 0 {
		// Slow senders start in the first half of the run and are
		// waited for: their verdicts come after the victims' deadlines.
		wg.Go(func() { sf.RunFor(ctx, max(c.Duration/2, time.Second)) })
	}
	wg.Wait()
	r := Report{Targets: targets, Fast: ff.Tally(), Slow: sf.Tally()}
	r.Breaches = r.Fast.Breaches()
	for n, a := range r.Slow.ByAttack {
		if a.Unanswered > 0 || a.Accepted > 0 {
			r.Breaches = append(r.Breaches, n)
		}
	}
	slices.Sort(r.Breaches)
	return r, ctx.Err()
}
