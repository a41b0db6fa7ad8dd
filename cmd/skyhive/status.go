package main

import (
	"context"
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/skyhive/skyhive/dht"
	"github.com/skyhive/skyhive/metrics"
	"github.com/skyhive/skyhive/node"
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

// check validates the flags before anything starts.
func (s *statusFlags) check() error {
	switch {
	case s.every < 0 || (s.every > 0 && (s.every < time.Second || s.every > metrics.MaxStatusPeriod)):
		return fmt.Errorf("--status-every %v: want 0 (off) or between 1s and %v", s.every, metrics.MaxStatusPeriod)
	case len(s.region) > 64 || !utf8.ValidString(s.region) || strings.ContainsFunc(s.region, func(r rune) bool { return !unicode.IsPrint(r) }):
		return fmt.Errorf("--region %q: want at most 64 bytes of printable text", s.region)
	}
	return nil
}

// config is the node's status configuration the flags describe, for a
// node of role.
func (s *statusFlags) config(role string) node.StatusConfig {
	return node.StatusConfig{Role: role, Region: s.region, Every: s.every}
}

// statusReport is what `skyhive status --json` prints.
type statusReport struct {
	Time    time.Time        `json:"time"`
	Peers   []metrics.Status `json:"peers"`
	Dropped int              `json:"dropped"`
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
				now := time.Now()
				peers, dropped, err := metrics.ReadStatus(ctx, n, now)
				if err != nil {
					return err
				}
				if asJSON {
					if peers == nil {
						peers = []metrics.Status{}
					}
					return printJSON(cmd.OutOrStdout(), statusReport{Time: now.UTC(), Peers: peers, Dropped: dropped})
				}
				printStatus(cmd.OutOrStdout(), peers, dropped, now)
				return nil
			})
		},
	}
	f.register(cmd, "DHT nodes of the swarm to read through: multiaddrs ending in /p2p/PEER_ID (required)")
	cmd.Flags().DurationVar(&f.timeout, "timeout", 20*time.Second, "give up after this long")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the records as JSON (with the number dropped)")
	return cmd
}

// printStatus prints the records as a table.
func printStatus(w io.Writer, peers []metrics.Status, dropped int, now time.Time) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "PEER\tROLE\tREGION\tVERSION\tSTEP\tSAMPLES/S\tLOSS\tREACH\tLAST SEEN")
	for _, s := range peers {
		loss := "-"
		if s.Loss != nil {
			loss = strconv.FormatFloat(*s.Loss, 'f', 4, 64)
		}
		seen := ago(now.Sub(s.Time)) + " ago"
		if !s.Alive(now) {
			seen += " (gone?)"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%.1f\t%s\t%s\t%s\n", shortID(s.Peer), s.Role, orDash(s.Region), orDash(s.Version),
			s.Step, s.SamplesPerSecond, loss, orDash(s.Reach), seen)
	}
	tw.Flush()
	fmt.Fprintf(w, "%d peers", len(peers))
	if dropped > 0 {
		fmt.Fprintf(w, "; %d invalid, forged or expired records left out", dropped)
	}
	fmt.Fprintln(w)
}

// ago rounds a duration for people: 850ms, 12s, 3m4s, 2h5m.
func ago(d time.Duration) string {
	switch {
	case d < 0:
		return "0s"
	case d < time.Second:
		return d.Round(10 * time.Millisecond).String()
	case d < time.Hour:
		return d.Round(time.Second).String()
	}
	return d.Round(time.Minute).String()
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
