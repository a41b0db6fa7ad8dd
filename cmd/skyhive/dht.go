package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/spf13/cobra"

	"github.com/skyhive/skyhive/dht"
	"github.com/skyhive/skyhive/dht/dhtrole"
	"github.com/skyhive/skyhive/launch"
	"github.com/skyhive/skyhive/metrics"
	"github.com/skyhive/skyhive/node"
	"github.com/skyhive/skyhive/p2p"
)

// dhtFlags are the options of the dht commands.
type dhtFlags struct {
	net     connectFlags
	timeout time.Duration
}

func (f *dhtFlags) register(cmd *cobra.Command, dht string) {
	f.net.register(cmd.Flags(), dht)
}

// dhtServeFlags are the options of `skyhive dht`.
type dhtServeFlags struct {
	dhtFlags
	out        outputFlags
	statsEvery time.Duration
	status     statusFlags
	metrics    metricsFlags
}

func (f *dhtServeFlags) register(cmd *cobra.Command) {
	f.dhtFlags.register(cmd, "other DHT nodes to join: multiaddrs ending in /p2p/PEER_ID (none: this node starts a DHT)")
	f.out.register(cmd.Flags(), "the node's peer ID and addresses", "routing-table peers and stored records, every --stats-every")
	cmd.Flags().DurationVar(&f.statsEvery, "stats-every", dhtrole.DefaultStatsEvery, "interval of --stats lines")
	f.status.register(cmd.Flags())
	f.metrics.register(cmd.Flags())
}

func newDHTCmd() *cobra.Command {
	var f dhtServeFlags
	cmd := &cobra.Command{
		Use:   "dht",
		Short: "Run a DHT node until interrupted (subcommands put and get use the DHT)",
		Long: "Run a standalone Kademlia DHT node that stores and serves records for the swarm.\n" +
			"It prints its multiaddrs, which other peers pass as --dht, and runs until Ctrl-C.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return runDHTRole(cmd.Context(), cmd.OutOrStdout(), cmd.ErrOrStderr(), f.config())
		},
	}
	f.register(cmd)
	serve := &cobra.Command{
		Use:   "serve",
		Short: "Run a DHT node until interrupted (same as plain `skyhive dht`)",
		Args:  cobra.NoArgs,
		RunE:  cmd.RunE, // with the same flags
	}
	f.register(serve)
	cmd.AddCommand(serve, newDHTPutCmd(), newDHTGetCmd())
	return cmd
}

func newDHTPutCmd() *cobra.Command {
	var (
		f      dhtFlags
		subkey string
		ttl    time.Duration
	)
	cmd := &cobra.Command{
		Use:   "put KEY VALUE",
		Short: "Store VALUE under KEY (and --subkey) with an expiration of now + --ttl",
		Long: "Start a short-lived client node, store the record on the nearest DHT peers and print\n" +
			"how many accepted it. Keys or subkeys containing [owner:PEER_ID], and subkeys that are a peer ID,\n" +
			"need --identity of that peer. --ttl is at most 6h; a plain value never replaces a key's subkeys.",
		Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := dhtrole.CheckTTL(ttl); err != nil {
				return flagError(err)
			}
			return withClientNode(cmd.Context(), f, func(ctx context.Context, _ *p2p.Host, n *dht.Node) error {
				return flagError(dhtrole.Put(ctx, n, args[0], subkey, []byte(args[1]), ttl, cmd.OutOrStdout()))
			})
		},
	}
	f.register(cmd, "DHT nodes to store through: multiaddrs ending in /p2p/PEER_ID (required)")
	cmd.Flags().StringVar(&subkey, "subkey", "", "subkey: the key becomes a dictionary merged across writers")
	cmd.Flags().DurationVar(&ttl, "ttl", time.Hour, "time to live")
	cmd.Flags().DurationVar(&f.timeout, "timeout", 30*time.Second, "give up after this long")
	return cmd
}

func newDHTGetCmd() *cobra.Command {
	var f dhtFlags
	cmd := &cobra.Command{
		Use:   "get KEY",
		Short: "Print the freshest value under KEY, one line per subkey",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return withClientNode(cmd.Context(), f, func(ctx context.Context, _ *p2p.Host, n *dht.Node) error {
				return dhtrole.Get(ctx, n, args[0], cmd.OutOrStdout())
			})
		},
	}
	f.register(cmd, "DHT nodes to read through: multiaddrs ending in /p2p/PEER_ID (required)")
	cmd.Flags().DurationVar(&f.timeout, "timeout", 30*time.Second, "give up after this long")
	return cmd
}

// config is the flags as the DHT role's typed config.
func (f *dhtServeFlags) config() launch.DHT {
	return launch.DHT{Net: f.net.Net,
		Process:    f.status.process(f.metrics.addr),
		Output:     launch.Output{JSON: f.out.json, Stats: f.out.stats},
		StatsEvery: launch.Duration(f.statsEvery)}
}

// dhtDefaults is the config of `skyhive dht` without flags, which a config
// file's fields replace.
func dhtDefaults() launch.DHT {
	var f dhtServeFlags
	f.register(&cobra.Command{})
	return f.config()
}

// runDHTRole runs a DHT node (dhtrole.Run) with its typed config, from
// the flags of `skyhive dht` or from a config file, until ctx ends: its
// addresses (or a JSON line) on stdout, notices on stderr and statistics
// on c.Stats.
func runDHTRole(ctx context.Context, stdout, stderr io.Writer, c launch.DHT) error {
	if err := dhtrole.Check(c); err != nil {
		return flagError(err)
	}
	host, err := roleHost(c.Net, c.Process)
	if err != nil {
		return err
	}
	var jsonOut io.Writer
	if c.JSON {
		jsonOut = stdout
	}
	return flagError(dhtrole.Run(ctx, dhtrole.Config{Node: node.FromLaunch(host, c.Net, c.Process, metrics.RoleDHT), DHT: c, Stdout: stdout, Stderr: stderr,
		Announce: func(ctx context.Context, h *p2p.Host) {
			fmt.Fprintln(stderr, "dht node: others join with --dht and one of the addresses below")
			p2p.ReportReach(ctx, h, stdout, jsonOut)
		}}))
}

// joinHint names the flags behind a failure to join the DHT.
func joinHint(err error) error {
	if errors.Is(err, node.ErrJoin) {
		return fmt.Errorf("join DHT: %w (flag --dht)", err)
	}
	return err
}

// withClientNode starts a client-mode node, joins through --dht and
// runs op within --timeout (dhtrole.WithClient).
func withClientNode(ctx context.Context, f dhtFlags, op func(context.Context, *p2p.Host, *dht.Node) error) error {
	host, err := roleHost(f.net.Net, launch.Process{})
	if err != nil {
		return err
	}
	return joinHint(flagError(dhtrole.WithClient(ctx, host, f.net.DHT, f.timeout, op)))
}
