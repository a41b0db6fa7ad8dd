package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/spf13/cobra"

	"github.com/skyhive/skyhive/dht"
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
	cmd.Flags().DurationVar(&f.statsEvery, "stats-every", 10*time.Second, "interval of --stats lines")
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
		RunE: func(cmd *cobra.Command, _ []string) error {
			return runDHTRole(cmd.Context(), cmd.OutOrStdout(), cmd.ErrOrStderr(), f.config())
		},
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
			if ttl <= 0 || ttl > dht.DefaultMaxTTL {
				return fmt.Errorf("--ttl must be positive and at most %v (DHT nodes refuse records that expire later), got %v", dht.DefaultMaxTTL, ttl)
			}
			return withClientNode(cmd.Context(), f, func(ctx context.Context, _ *p2p.Host, n *dht.Node) error {
				exp := time.Now().Add(ttl)
				k, err := n.Store(ctx, args[0], subkey, []byte(args[1]), exp)
				if err != nil {
					return err
				}
				fmt.Fprintf(cmd.OutOrStdout(), "stored on %d peers, expires %s\n", k, exp.UTC().Format(time.RFC3339))
				return nil
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
				items, err := n.Get(ctx, args[0])
				if err != nil {
					return err
				}
				dht.WriteItems(cmd.OutOrStdout(), items)
				return nil
			})
		},
	}
	f.register(cmd, "DHT nodes to read through: multiaddrs ending in /p2p/PEER_ID (required)")
	cmd.Flags().DurationVar(&f.timeout, "timeout", 30*time.Second, "give up after this long")
	return cmd
}

// startNode starts the node of a dht command: its host as net
// describes it, its DHT node in mode joined through --dht within timeout
// (0: node's default), and what cfg adds (metrics, status, logs).
func startNode(ctx context.Context, net connectFlags, mode string, timeout time.Duration, cfg node.Config) (*node.Node, error) {
	if _, err := net.seeds(); err != nil {
		return nil, err
	}
	hcfg, err := net.config()
	if err != nil {
		return nil, err
	}
	cfg.Host = &hcfg
	cfg.DHT.Mode, cfg.DHT.Bootstrap, cfg.DHT.JoinTimeout = mode, net.DHT, timeout
	if mode == node.DHTServer {
		cfg.DHT.MaxBytes = net.DHTMaxBytes()
	}
	return node.New(ctx, cfg)
}

// config is the flags as the DHT role's typed config.
func (f *dhtServeFlags) config() launch.DHT {
	return launch.DHT{Net: f.net.launchNet(),
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

// runDHTRole runs a DHT node with its typed config, from the flags of
// `skyhive dht` or from a config file, until ctx ends: its addresses (or
// a JSON line) on stdout, notices on stderr and statistics on c.Stats.
func runDHTRole(ctx context.Context, stdout, stderr io.Writer, c launch.DHT) error {
	status := statusFlags{region: c.Region, every: max(time.Duration(c.StatusEvery), 0)}
	if c.Stats != "" && c.StatsEvery <= 0 {
		return fmt.Errorf("--stats-every must be positive, got %v", time.Duration(c.StatsEvery))
	}
	if err := status.check(); err != nil {
		return err
	}
	stats, closeStats, err := (&outputFlags{stats: c.Stats}).openStats()
	if err != nil {
		return err
	}
	defer closeStats()
	// Joining is optional: others may bootstrap from this node, and the
	// periodic refresh retries through whoever contacts it.
	n, err := startNode(ctx, connectFlagsOf(c.Net), node.DHTServer, 0, node.Config{
		MetricsAddr: c.Metrics, ServeDialback: true, Log: stderr,
		DHT:    node.DHTConfig{Optional: true},
		Status: status.config(metrics.RoleDHT),
	})
	if err != nil {
		return err
	}
	defer n.Close()
	var jsonOut io.Writer
	if c.JSON {
		jsonOut = stdout
	}
	fmt.Fprintln(stderr, "dht node: others join with --dht and one of the addresses below")
	p2p.ReportReach(ctx, n.Host(), stdout, jsonOut)
	d := n.DHT()
	if err := n.StartStatus(func(s *metrics.Status) {
		s.DHT = &metrics.DHTStatus{Peers: len(d.Peers()), Records: d.Records()}
	}); err != nil {
		return err
	}
	err = d.WriteStats(ctx, stats, time.Duration(c.StatsEvery))
	fmt.Fprintln(stderr, "stopping")
	if err != nil {
		return fmt.Errorf("--stats: %w", err)
	}
	return nil
}

// joinHint names the flags behind a failure to join the DHT.
func joinHint(err error) error {
	if errors.Is(err, node.ErrJoin) {
		return fmt.Errorf("join DHT: %w (flag --dht)", err)
	}
	return err
}

// withClientNode starts a client-mode node, joins through --dht and
// runs op within --timeout.
func withClientNode(ctx context.Context, f dhtFlags, op func(context.Context, *p2p.Host, *dht.Node) error) error {
	if len(f.net.DHT) == 0 {
		return errors.New("--dht is required: the multiaddr of a DHT node, ending in /p2p/PEER_ID")
	}
	ctx, cancel := context.WithTimeout(ctx, f.timeout)
	defer cancel()
	n, err := startNode(ctx, f.net, node.DHTClient, f.timeout, node.Config{})
	if err != nil {
		return joinHint(err)
	}
	defer n.Close()
	return op(ctx, n.Host(), n.DHT())
}
