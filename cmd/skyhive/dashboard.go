package main

import (
	"time"

	"github.com/spf13/cobra"

	"github.com/skyhive/skyhive/dashboard"
	"github.com/skyhive/skyhive/launch"
)

// dashboardFlags are the options of `skyhive dashboard`: the page's (run;
// its Host and DHT come from net). --listen is the web page's address
// here, so of the connectivity flags it takes only those a light client
// needs.
type dashboardFlags struct {
	net connectFlags
	run dashboard.RunConfig
}

func newDashboardCmd() *cobra.Command {
	var f dashboardFlags
	cmd := &cobra.Command{
		Use:   "dashboard",
		Short: "Serve a live web page of the swarm: peers by region, experts, pipeline stages, averaging rounds, curves",
		Long: "Join the swarm's DHT as a light client, read the peers' signed status records every --every\n" +
			"and serve a web page on --listen that updates live (server-sent events): the peers by region\n" +
			"with their links and round-trip times, the expert grids with each expert's load and whether its\n" +
			"servers are alive, the pipeline's stages with compute, communication and idle time and the\n" +
			"current plan, the averaging runs with their rounds and groups, and loss and accuracy curves.\n" +
			"The page is served by this binary, with no external assets: it works without internet access.\n" +
			"/api/swarm serves the same data as JSON. It listens on loopback by default; the page shows\n" +
			"the swarm to whoever can open it.",
		Example: "  skyhive dashboard --dht /ip4/10.0.0.1/tcp/4001/p2p/12D3KooW...   # then open http://127.0.0.1:8080\n" +
			"  skyhive dashboard --dht ADDR --listen 127.0.0.1:9000 --every 5s",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			host, err := roleHost(f.net.Net, launch.Process{})
			if err != nil {
				return err
			}
			c := f.run
			c.Host, c.DHT = host, f.net.DHT
			return joinHint(flagError(dashboard.Run(cmd.Context(), c, cmd.OutOrStdout())))
		},
	}
	fl := cmd.Flags()
	fl.StringSliceVar(&f.net.DHT, "dht", nil, "DHT nodes of the swarm to read through: multiaddrs ending in /p2p/PEER_ID (required)")
	fl.StringVar(&f.run.Listen, "listen", "127.0.0.1:8080", "address of the web page (host:port; port 0 picks a free one)")
	fl.DurationVar(&f.run.Every, "every", 3*time.Second, "how often to read the status records")
	fl.DurationVar(&f.run.Timeout, "timeout", 30*time.Second, "give up joining the DHT after this long")
	fl.StringVar(&f.net.Identity, "identity", "", "private key file (created if missing), for a stable peer ID")
	fl.StringVar(&f.net.SwarmSecret, "swarm-secret", "", "the swarm's secret file, to read a swarm closed with --swarm-secret")
	fl.StringVar(&f.net.SwarmKey, "swarm-key", "", "the swarm key's .pub file, to read a swarm closed with --swarm-key (needs --member-token)")
	fl.StringVar(&f.net.MemberToken, "member-token", "", "this dashboard's member token for --swarm-key")
	f.net.HolePunching, f.net.AutoNAT, f.net.Reachability = true, false, "auto"
	return cmd
}
