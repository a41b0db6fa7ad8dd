package main

import (
	"github.com/spf13/cobra"

	"github.com/skyhive/skyhive/hostile"
)

// newAttackCmd runs the hostile peer against peers of one's own swarm.
func newAttackCmd() *cobra.Command {
	o := hostile.DefaultOptions()
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
registrations, and slow senders. With --squat-run it instead joins a run's
fixed roster (rank matchmaking) as a stranger that takes contributions and
never answers.

It prints, per attack, how many requests the victims refused, held or
accepted (a request left unread by a victim that had blocked the identity, after
it sent poisoned values, counts as refused), and how many found nothing to attack (n/a: e.g. an erasure of a DHT
dictionary the node does not hold). Some requests an honest peer may also send (records within the
quota, a registration): those are "absorbed". Any other request accepted, or a
slow sender held to the end, is a breach: skyhive attack then exits with an
error. Attack only peers you run: the flood is meant to hurt.`,
		Example: `  skyhive attack --target /ip4/127.0.0.1/tcp/4001/p2p/12D3KooW... --duration 40s
  skyhive attack --target ADDR1 --target ADDR2 --identities 16 --rate 400 --json
  skyhive attack --target DHT_ADDR --squat-run myrun --duration 2m`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return flagError(o.Run(cmd.Context(), cmd.OutOrStdout(), cmd.ErrOrStderr()))
		},
	}
	fl := cmd.Flags()
	fl.StringSliceVar(&o.Targets, "target", nil, "multiaddr of a peer to attack, ending in /p2p/ID (repeat for several)")
	fl.StringSliceVar(&o.Listen, "listen", o.Listen, "multiaddrs the attacker's identities listen on")
	fl.IntVar(&o.Identities, "identities", o.Identities, "identities (peer IDs) the attacks come from")
	fl.IntVar(&o.SlowIdentities, "slow-identities", 2, "identities of their own the slow senders come from")
	fl.Float64Var(&o.Rate, "rate", o.Rate, "quick hostile requests per second, in all")
	fl.Float64Var(&o.SlowRate, "slow-rate", o.SlowRate, "slow senders started per second during the first half of --duration (0: none)")
	fl.DurationVar(&o.Duration, "duration", o.Duration, "how long to send quick requests")
	fl.StringVar(&o.SquatRun, "squat-run", "", "instead of the floods, join this run's fixed roster (rank matchmaking) as a stranger for --duration: copy its model signature, answer as a member, hold every contribution unanswered (--target: DHT nodes)")
	fl.BoolVar(&o.JSON, "json", false, "print the report (targets, tallies per attack, breaches) as JSON on stdout")
	return cmd
}
