package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"time"

	"github.com/spf13/cobra"

	"github.com/skyhive/skyhive/dashboard"
	"github.com/skyhive/skyhive/node"
)

// dashboardFlags are the options of `skyhive dashboard`. --listen is the
// web page's address here, so of the connectivity flags it takes only
// those a light client needs.
type dashboardFlags struct {
	net     connectFlags
	listen  string
	every   time.Duration
	timeout time.Duration
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
		RunE: func(cmd *cobra.Command, _ []string) error { return runDashboard(cmd, f) },
	}
	fl := cmd.Flags()
	fl.StringSliceVar(&f.net.DHT, "dht", nil, "DHT nodes of the swarm to read through: multiaddrs ending in /p2p/PEER_ID (required)")
	fl.StringVar(&f.listen, "listen", "127.0.0.1:8080", "address of the web page (host:port; port 0 picks a free one)")
	fl.DurationVar(&f.every, "every", 3*time.Second, "how often to read the status records")
	fl.DurationVar(&f.timeout, "timeout", 30*time.Second, "give up joining the DHT after this long")
	fl.StringVar(&f.net.Identity, "identity", "", "private key file (created if missing), for a stable peer ID")
	fl.StringVar(&f.net.SwarmSecret, "swarm-secret", "", "the swarm's secret file, to read a swarm closed with --swarm-secret")
	fl.StringVar(&f.net.SwarmKey, "swarm-key", "", "the swarm key's .pub file, to read a swarm closed with --swarm-key (needs --member-token)")
	fl.StringVar(&f.net.MemberToken, "member-token", "", "this dashboard's member token for --swarm-key")
	f.net.HolePunching, f.net.AutoNAT, f.net.Reachability = true, false, "auto"
	return cmd
}

func runDashboard(cmd *cobra.Command, f dashboardFlags) error {
	ctx := cmd.Context()
	if len(f.net.DHT) == 0 {
		return errors.New("--dht is required: the multiaddr of a DHT node of the swarm, ending in /p2p/PEER_ID")
	}
	if f.every < 100*time.Millisecond {
		return fmt.Errorf("--every %v: want at least 100ms", f.every)
	}
	ln, err := net.Listen("tcp", f.listen)
	if err != nil {
		return fmt.Errorf("--listen: %w", err)
	}
	defer ln.Close()
	jctx, cancel := context.WithTimeout(ctx, f.timeout)
	n, err := startNode(jctx, f.net, node.DHTClient, f.timeout, node.Config{})
	cancel()
	if err != nil {
		return joinHint(err)
	}
	defer n.Close()
	d, err := dashboard.New(dashboard.Config{Every: f.every, Source: dashboard.DHTSource(n.DHT(), n.Seeds())})
	if err != nil {
		return err
	}
	fmt.Fprintf(cmd.OutOrStdout(), "dashboard: http://%s/ (Ctrl-C to stop)\n", ln.Addr())
	return dashboard.Serve(ctx, ln, d)
}
