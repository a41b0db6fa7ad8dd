package main

import (
	"context"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/skyhive/skyhive/dht"
	"github.com/skyhive/skyhive/launch"
	"github.com/skyhive/skyhive/metrics"
	"github.com/skyhive/skyhive/p2p"
)

// statusFlags are how a long-running command publishes its status record
// (metrics.Status) in the swarm's DHT: --region and --status-every.
type statusFlags struct {
	region string
	every  time.Duration
}

func (s *statusFlags) register(fl *pflag.FlagSet) {
	fl.StringVar(&s.region, "region", "", "network region of this peer, shown by skyhive status and skyhive dashboard")
	s.registerEvery(fl)
}

// registerEvery adds --status-every alone, for commands that name their
// region otherwise.
func (s *statusFlags) registerEvery(fl *pflag.FlagSet) {
	fl.DurationVar(&s.every, "status-every", metrics.DefaultStatusPeriod, "publish this peer's signed status record in the DHT this often, for skyhive status and skyhive dashboard (0: never)")
}

// process is the status flags, and the --metrics address, as a config's
// process options. --status-every 0 (never) is negative there, where 0 is
// the default.
func (s *statusFlags) process(metrics string) launch.Process {
	every := launch.Duration(s.every)
	if s.every == 0 {
		every = -1
	}
	return launch.Process{Region: s.region, StatusEvery: every, Metrics: metrics}
}

func newStatusCmd() *cobra.Command {
	var (
		f      dhtFlags
		asJSON bool
	)
	cmd := &cobra.Command{
		Use:   "status",
		Short: "Print the swarm's peers from their signed status records in the DHT",
		Long: "Join the swarm's DHT as a light client and read the status record every long-running peer\n" +
			"publishes (skyhive dht, server, peer, train moe and train pipeline with --dht): its role, region,\n" +
			"version, training step, throughput, reachability and when it was last seen. Each record is\n" +
			"signed by its peer; records that are forged, expired or malformed are left out (and counted).\n" +
			"A peer last seen more than three of its periods ago is marked gone.",
		Example: "  skyhive status --dht /ip4/10.0.0.1/tcp/4001/p2p/12D3KooW...\n" +
			"  skyhive status --dht ADDR --json | jq '.peers[] | {peer, role, step}'",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return withClientNode(cmd.Context(), f, func(ctx context.Context, _ *p2p.Host, n *dht.Node) error {
				rep, err := metrics.ReadStatusReport(ctx, n, time.Now())
				if err != nil {
					return err
				}
				if asJSON {
					return printJSON(cmd.OutOrStdout(), rep)
				}
				rep.WriteTable(cmd.OutOrStdout())
				return nil
			})
		},
	}
	f.register(cmd, "DHT nodes of the swarm to read through: multiaddrs ending in /p2p/PEER_ID (required)")
	cmd.Flags().DurationVar(&f.timeout, "timeout", 20*time.Second, "give up after this long")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the records as JSON (with the number dropped)")
	return cmd
}
