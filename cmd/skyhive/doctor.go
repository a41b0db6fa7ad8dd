package main

import (
	"context"
	"time"

	"github.com/spf13/cobra"

	"github.com/skyhive/skyhive/dht"
	"github.com/skyhive/skyhive/p2p"
	"github.com/skyhive/skyhive/p2p/dialback"
)

func newDoctorCmd() *cobra.Command {
	var (
		f     dhtFlags
		out   outputFlags
		peers int
	)
	cmd := &cobra.Command{
		Use:   "doctor --dht ADDR",
		Short: "Check whether a swarm's peers can reach this machine: they dial it back and say what they saw",
		Long: "Start a host with the connectivity flags you would give `peer`, `server` or `worker`\n" +
			"(the same --listen and --announce), join the swarm's DHT, and ask up to --peers of its\n" +
			"peers to open a new TCP connection to each of this host's addresses. It prints what each\n" +
			"peer saw and what to do if none got through. Peers only dial addresses on the IP the\n" +
			"request came from.",
		Example: "  skyhive doctor --dht /ip4/203.0.113.1/tcp/4001/p2p/12D3KooW... --listen /ip4/0.0.0.0/tcp/4002",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			var rep dialback.Report
			err := withClientNode(cmd.Context(), f, func(ctx context.Context, h *p2p.Host, node *dht.Node) (err error) {
				seeds, _ := f.net.seeds() // parsed before, by withClientNode
				rep, err = dialback.Check(ctx, h, seeds, node.Peers(), peers)
				return err
			})
			if err != nil {
				return err
			}
			rep.Verdict = "verdict: reachable directly; others can dial this host at the addresses that connected"
			if !rep.Reachable {
				rep.Verdict = "verdict: not reachable directly: forward a port to this machine and pass --listen /ip4/0.0.0.0/tcp/PORT " +
					"--announce /ip4/PUBLIC_IP/tcp/PORT, or join through a relay with --relay ADDR (a public peer started with --relay-service)"
			}
			if out.json {
				return printJSON(cmd.OutOrStdout(), rep)
			}
			rep.WriteText(cmd.OutOrStdout())
			return nil
		},
	}
	f.register(cmd, "DHT peers of the swarm to ask: multiaddrs ending in /p2p/PEER_ID (required)")
	fl := cmd.Flags()
	fl.BoolVar(&out.json, "json", false, "print the report as JSON on stdout")
	fl.IntVar(&peers, "peers", 3, "how many of the swarm's peers to ask")
	fl.DurationVar(&f.timeout, "timeout", time.Minute, "give up after this long")
	cmd.PreRunE = checkedNumbers(numberRules{Positive: []string{"peers"}})
	return cmd
}
