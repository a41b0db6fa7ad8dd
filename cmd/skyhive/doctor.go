package main

import (
	"context"
	"fmt"
	"slices"
	"text/tabwriter"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/spf13/cobra"

	"github.com/skyhive/skyhive/dht"
	"github.com/skyhive/skyhive/p2p"
	"github.com/skyhive/skyhive/p2p/dialback"
)

// doctorReport is what doctor --json prints.
type doctorReport struct {
	Peer  string                       `json:"peer"`
	Reach p2p.Reach                    `json:"reach"`
	Seen  map[string][]dialback.Result `json:"seen"` // by the dialling peer's ID
	// Reachable reports whether some peer connected to some address.
	Reachable bool   `json:"reachable"`
	Verdict   string `json:"verdict"`
}

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
			if peers < 1 {
				return fmt.Errorf("--peers must be at least 1, got %d", peers)
			}
			var rep doctorReport
			err := withClientNode(cmd.Context(), f, func(ctx context.Context, h *p2p.Host, node *dht.Node) (err error) {
				seeds, _ := f.net.seeds() // parsed before, by withClientNode
				rep, err = askDialback(ctx, h, node, seeds, peers)
				return err
			})
			if err != nil {
				return err
			}
			if out.json {
				return printJSON(cmd.OutOrStdout(), rep)
			}
			w := cmd.OutOrStdout()
			fmt.Fprintf(w, "peer %s\n", rep.Peer)
			printReach(w, rep.Reach)
			tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "DIALLED BY\tADDRESS\tRESULT")
			for by, rs := range rep.Seen {
				for _, r := range rs {
					res := fmt.Sprintf("connected in %.1f ms", r.Millis)
					if !r.OK {
						res = r.Error
					}
					fmt.Fprintf(tw, "%s\t%s\t%s\n", shortID(by), r.Addr, res)
				}
			}
			tw.Flush()
			fmt.Fprintln(w, rep.Verdict)
			return nil
		},
	}
	f.register(cmd, "DHT peers of the swarm to ask: multiaddrs ending in /p2p/PEER_ID (required)")
	fl := cmd.Flags()
	fl.BoolVar(&out.json, "json", false, "print the report as JSON on stdout")
	fl.IntVar(&peers, "peers", 3, "how many of the swarm's peers to ask")
	fl.DurationVar(&f.timeout, "timeout", time.Minute, "give up after this long")
	return cmd
}

// askDialback asks up to peers of the swarm node has joined, the seeds
// first, to dial h back.
func askDialback(ctx context.Context, h *p2p.Host, node *dht.Node, seeds []peer.AddrInfo, peers int) (doctorReport, error) {
	rep := doctorReport{Peer: h.ID().String(), Reach: h.Reach(), Seen: map[string][]dialback.Result{}}
	asked := map[peer.ID]bool{}
	candidates := slices.Clone(seeds)
	for _, id := range node.Peers() {
		candidates = append(candidates, h.LibP2P().Peerstore().PeerInfo(id))
	}
	var lastErr error
	for _, c := range candidates {
		if len(asked) == peers || asked[c.ID] || c.ID == h.ID() {
			continue
		}
		asked[c.ID] = true
		res, err := dialback.Ask(ctx, h, c, rep.Reach.Addrs)
		if err != nil {
			lastErr = err
			continue
		}
		rep.Seen[c.ID.String()] = res
		for _, r := range res {
			rep.Reachable = rep.Reachable || r.OK
		}
	}
	switch {
	case len(rep.Seen) == 0:
		return rep, fmt.Errorf("no peer of the swarm answered the dial-back request (peers run skyhive dht, server or peer of this version): %w", lastErr)
	case rep.Reachable:
		rep.Verdict = "verdict: reachable directly; others can dial this host at the addresses that connected"
	default:
		rep.Verdict = "verdict: not reachable directly: forward a port to this machine and pass --listen /ip4/0.0.0.0/tcp/PORT " +
			"--announce /ip4/PUBLIC_IP/tcp/PORT, or join through a relay with --relay ADDR (a public peer started with --relay-service)"
	}
	return rep, nil
}
