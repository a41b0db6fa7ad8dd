package main

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/spf13/cobra"

	"github.com/skyhive/skyhive/hostile"
	"github.com/skyhive/skyhive/p2p"
)

// newAttackCmd runs the hostile peer against peers of one's own swarm.
func newAttackCmd() *cobra.Command {
	var (
		targets    []string
		listen     []string
		identities int
		rate       float64
		slowRate   float64
		duration   time.Duration
		jsonOut    bool
	)
	cmd := &cobra.Command{
		Use:   "attack --target ADDR [--target ADDR ...]",
		Short: "Attack your own swarm's peers as a stranger would, and report what they refused",
		Long: `Run the hostile peer (package hostile, docs/security.md) against peers you run:
it learns which roles each target plays from the protocols it speaks (expert
server, DHT node, averaging peer, pipeline worker or coordinator), then sends,
from --identities identities, every attack that fits: poisoned gradients and
contributions (NaN, Inf, 3e38), shape and length claims, forged, hijacking and
far-future DHT records, storage floods and Sybil pings, session squatting,
strangers' control calls and 512 MiB activation frames, fake worker
registrations, and slow senders.

It prints, per attack, how many requests the victims refused, held or
accepted (a request left unread by a victim that had blocked the identity, after
it sent poisoned values, counts as refused), and how many found nothing to attack (n/a: e.g. an erasure of a DHT
dictionary the node does not hold). Some requests an honest peer may also send (records within the
quota, a registration): those are "absorbed". Any other request accepted, or a
slow sender held to the end, is a breach: skyhive attack then exits with an
error. Attack only peers you run: the flood is meant to hurt.`,
		Example: `  skyhive attack --target /ip4/127.0.0.1/tcp/4001/p2p/12D3KooW... --duration 40s
  skyhive attack --target ADDR1 --target ADDR2 --identities 16 --rate 400 --json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if len(targets) == 0 {
				return errors.New("--target is required: the multiaddr (ending in /p2p/ID) of a peer you run")
			}
			if identities < 1 || rate <= 0 || duration <= 0 {
				return errors.New("--identities, --rate and --duration must be positive")
			}
			if slowRate < 0 {
				return errors.New("--slow-rate must not be negative (0: no slow senders)")
			}
			peers, err := p2p.ParseAddrInfos(targets)
			if err != nil {
				return fmt.Errorf("--target: %w", err)
			}
			if slowRate == 0 {
				slowRate = -1 // hostile.RunConfig: none
			}
			w, progress := cmd.OutOrStdout(), cmd.OutOrStdout()
			if jsonOut {
				progress = cmd.ErrOrStderr()
			}
			c := hostile.RunConfig{
				Targets: peers, Identities: identities, Rate: rate, SlowRate: slowRate, Duration: duration,
				NewHost: func(ctx context.Context) (*p2p.Host, error) {
					return p2p.New(ctx, p2p.Config{ListenAddrs: listen})
				},
			}
			c.WriteStart(progress)
			r, err := hostile.Run(cmd.Context(), c)
			if err != nil {
				return err
			}
			if jsonOut {
				if err := printJSON(w, r); err != nil {
					return err
				}
			} else {
				r.WriteText(w)
			}
			return r.Err()
		},
	}
	fl := cmd.Flags()
	fl.StringSliceVar(&targets, "target", nil, "multiaddr of a peer to attack, ending in /p2p/ID (repeat for several)")
	fl.StringSliceVar(&listen, "listen", []string{"/ip4/127.0.0.1/tcp/0"}, "multiaddrs the attacker's identities listen on")
	fl.IntVar(&identities, "identities", 4, "identities (peer IDs) the attacks come from")
	fl.Float64Var(&rate, "rate", 100, "quick hostile requests per second, in all")
	fl.Float64Var(&slowRate, "slow-rate", 1, "slow senders started per second during the first half of --duration (0: none)")
	fl.DurationVar(&duration, "duration", 30*time.Second, "how long to send quick requests")
	fl.BoolVar(&jsonOut, "json", false, "print the report (targets, tallies per attack, breaches) as JSON on stdout")
	return cmd
}
