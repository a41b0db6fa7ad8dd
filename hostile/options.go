package hostile

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"sync"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/skyhive/skyhive/launch"
	"github.com/skyhive/skyhive/p2p"
)

// Options configure Options.Run, as `skyhive attack` gives them. Errors about
// them are *launch.FieldError naming them by their snake_case names
// (target, slow_rate, …).
type Options struct {
	// Targets are the multiaddrs, ending in /p2p/ID, of the peers to
	// attack (required).
	Targets []string
	// Listen are the multiaddrs the attacker's identities listen on.
	Listen []string
	// Identities, Rate, SlowRate and Duration are RunConfig's; SlowRate 0
	// starts no slow senders.
	Identities int
	// SlowIdentities is RunConfig's (0: its default).
	SlowIdentities int
	Rate           float64
	SlowRate       float64
	Duration       time.Duration
	// JSON prints the report as JSON, and the start line on stderr.
	JSON bool
	// SquatRun, instead of the floods, squats the fixed roster of this
	// run (RosterSquat) for Duration, joining the DHT through Targets.
	SquatRun string
}

// DefaultOptions are the options of `skyhive attack` without flags, but
// for the targets.
func DefaultOptions() Options {
	return Options{Listen: []string{"/ip4/127.0.0.1/tcp/0"}, Identities: 4, Rate: 100, SlowRate: 1, Duration: 30 * time.Second}
}

// Check reports the first invalid option.
func (o Options) Check() error {
	switch {
	case len(o.Targets) == 0:
		return &launch.FieldError{Fields: []string{"target"}, Text: "%s is required: the multiaddr (ending in /p2p/ID) of a peer you run"}
	case o.Identities < 1 || o.Rate <= 0 || o.Duration <= 0:
		return &launch.FieldError{Fields: []string{"identities", "rate", "duration"}, Text: "%s, %s and %s must be positive"}
	case o.SlowRate < 0:
		return &launch.FieldError{Fields: []string{"slow_rate"}, Text: "%s must not be negative (0: no slow senders)"}
	}
	return nil
}

// Run runs the hostile peer (the function Run) against o's targets: it prints what
// it starts on stdout (stderr with JSON), then the report on stdout, as
// text or JSON; it fails if a target breached (Report.Err).
func (o Options) Run(ctx context.Context, stdout, stderr io.Writer) error {
	if err := o.Check(); err != nil {
		return err
	}
	peers, err := p2p.ParseAddrInfos(o.Targets)
	if err != nil {
		return &launch.FieldError{Fields: []string{"target"}, Text: "%s", Err: err}
	}
	if o.SquatRun != "" {
		return o.squat(ctx, peers, stdout)
	}
	if o.SlowRate == 0 {
		o.SlowRate = -1 // RunConfig: none
	}
	progress := stdout
	if o.JSON {
		progress = stderr
	}
	c := RunConfig{
		Targets: peers, Identities: o.Identities, SlowIdentities: o.SlowIdentities, Rate: o.Rate, SlowRate: o.SlowRate, Duration: o.Duration,
		NewHost: func(ctx context.Context) (*p2p.Host, error) {
			return p2p.New(ctx, p2p.Config{ListenAddrs: o.Listen})
		},
	}
	c.WriteStart(progress)
	r, err := Run(ctx, c)
	if err != nil {
		return err
	}
	if o.JSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		if err := enc.Encode(r); err != nil {
			return err
		}
	} else {
		r.WriteText(stdout)
	}
	return r.Err()
}

// squat runs two RosterSquats of o.SquatRun through the DHT nodes peers,
// one that answers as a member and one that only lists itself, and
// prints their tallies.
func (o Options) squat(ctx context.Context, peers []peer.AddrInfo, stdout io.Writer) error {
	tallies := make([]SquatTally, 2)
	errs := make([]error, 2)
	var wg sync.WaitGroup
	for i := range tallies {
		h, err := p2p.New(ctx, p2p.Config{ListenAddrs: o.Listen})
		if err != nil {
			return err
		}
		defer h.Close()
		fmt.Fprintf(stdout, "squatting run %q's roster as %s (%s) for %v\n", o.SquatRun, h.ID(), squatKinds[i], o.Duration)
		wg.Go(func() {
			tallies[i], errs[i] = RosterSquat{Host: h, DHT: peers, RunID: o.SquatRun, Silent: i == 1}.Run(ctx, o.Duration)
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return err
	}
	if o.JSON {
		return json.NewEncoder(stdout).Encode(map[string]SquatTally{squatKinds[0]: tallies[0], squatKinds[1]: tallies[1]})
	}
	for i, t := range tallies {
		last := "never"
		if !t.LastHeld.IsZero() {
			last = t.LastHeld.Format(time.RFC3339)
		}
		fmt.Fprintf(stdout, "%s: copied model signature %s; answered %d roster questions; held %d requests (%d bytes) unanswered, the last %s\n",
			squatKinds[i], t.Signature, t.Questions, t.Held, t.HeldBytes, last)
	}
	return nil
}

// squatKinds name the two squatters' tallies.
var squatKinds = [2]string{"member", "listing"}
