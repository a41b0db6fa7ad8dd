package hostile

import (
	"context"
	"encoding/json"
	"io"
	"time"

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
	Rate       float64
	SlowRate   float64
	Duration   time.Duration
	// JSON prints the report as JSON, and the start line on stderr.
	JSON bool
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
	if o.SlowRate == 0 {
		o.SlowRate = -1 // RunConfig: none
	}
	progress := stdout
	if o.JSON {
		progress = stderr
	}
	c := RunConfig{
		Targets: peers, Identities: o.Identities, Rate: o.Rate, SlowRate: o.SlowRate, Duration: o.Duration,
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
