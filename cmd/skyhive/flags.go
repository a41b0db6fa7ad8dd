package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/skyhive/skyhive/data"
	"github.com/skyhive/skyhive/internal/memlimit"
	"github.com/skyhive/skyhive/jsonl"
	"github.com/skyhive/skyhive/launch"
	"github.com/skyhive/skyhive/node"
	"github.com/skyhive/skyhive/p2p"
)

// Flag groups shared by the commands, so that one name means one thing,
// in one unit, everywhere:
//
//   - output: --json (the result as JSON on stdout) and --stats FILE (JSON
//     lines appended while the command runs);
//   - connectivity: --dht (peers of the swarm's DHT to join), --listen,
//     --announce, --identity, NAT traversal (--relay, ...), and closing the
//     swarm (--swarm-secret, or --swarm-key with --member-token);
//   - emulated links: --latency (one-way, a Go duration) and --bandwidth
//     (Mbit/s), as in netem's region profiles;
//   - data: --data-dir and --limit;
//   - metrics: --metrics ADDR (Prometheus metrics on http://ADDR/metrics),
//     on every long-running command.

// numberRules say which numeric flags checkNumbers holds to more, or less,
// than "a finite number, not negative".
type numberRules struct {
	// Positive names the flags that must be above zero.
	Positive []string
	// Negative names the flags whose negative values mean something
	// (e.g. "disabled").
	Negative []string
}

// checkNumbers validates the numeric flags given on the command line (ints,
// floats and durations; defaults are not checked) as soon as a command
// starts, before it loads data or joins a network: each must be a finite
// number and not negative, except as r says. The error names the first
// offending flag, with the value given and what it must be.
func checkNumbers(fl *pflag.FlagSet, r numberRules) error {
	var first error
	fl.Visit(func(f *pflag.Flag) {
		if first != nil {
			return
		}
		var v float64
		switch f.Value.Type() {
		case "int", "int8", "int16", "int32", "int64", "float32", "float64":
			x, err := strconv.ParseFloat(f.Value.String(), 64)
			if err != nil {
				return
			}
			v = x
		case "duration":
			d, err := time.ParseDuration(f.Value.String())
			if err != nil {
				return
			}
			v = float64(d)
		default:
			return
		}
		switch {
		case math.IsNaN(v) || math.IsInf(v, 0):
			first = fmt.Errorf("--%s %s: must be a finite number", f.Name, f.Value)
		case slices.Contains(r.Positive, f.Name) && v <= 0:
			first = fmt.Errorf("--%s %s: must be above 0", f.Name, f.Value)
		case v < 0 && !slices.Contains(r.Negative, f.Name):
			first = fmt.Errorf("--%s %s: must not be negative", f.Name, f.Value)
		}
	})
	return first
}

// checkedNumbers is a cobra PreRunE that checks the command's numeric flags
// (checkNumbers) before it runs: cmd.PreRunE = checkedNumbers(rules).
func checkedNumbers(r numberRules) func(*cobra.Command, []string) error {
	return func(cmd *cobra.Command, _ []string) error { return checkNumbers(cmd.Flags(), r) }
}

// outputFlags are --json and --stats.
type outputFlags struct {
	json  bool
	stats string
}

// register adds --json and --stats; result says what --json prints, lines
// what --stats appends (and when).
func (o *outputFlags) register(fl *pflag.FlagSet, result, lines string) {
	fl.BoolVar(&o.json, "json", false, "print "+result+" as JSON on stdout")
	fl.StringVar(&o.stats, "stats", "", "append JSON lines to this file: "+lines)
}

// openStats opens --stats for appending; it returns a nil writer and a
// no-op close without --stats.
func (o *outputFlags) openStats() (io.Writer, func() error, error) {
	w, closeFile, err := jsonl.Open(o.stats)
	if err != nil {
		return nil, nil, fmt.Errorf("--stats: %w", err)
	}
	return w, closeFile, nil
}

// printJSON prints v as indented JSON.
func printJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// linkFlags describe one emulated link: --latency and --bandwidth.
type linkFlags struct {
	latency   time.Duration
	bandwidth float64 // Mbit/s
}

// register adds --latency (default latency) and --bandwidth; what says
// which link they emulate.
func (l *linkFlags) register(fl *pflag.FlagSet, what string, latency time.Duration) {
	fl.DurationVar(&l.latency, "latency", latency, "emulated one-way latency "+what+" (0: none)")
	fl.Float64Var(&l.bandwidth, "bandwidth", 0, "emulated bandwidth "+what+", Mbit/s (0: unlimited)")
}

// dataFlags locate Fashion-MNIST and bound the training set.
type dataFlags struct {
	dir   string
	limit int
}

func (d *dataFlags) register(fl *pflag.FlagSet) {
	fl.StringVar(&d.dir, "data-dir", data.DefaultDir, "directory holding the Fashion-MNIST IDX files")
	fl.IntVar(&d.limit, "limit", 0, "use only the first N training examples (0 = all)")
}

// legacyTrainArgs rewrites the retired `skyhive train --mode MODE …` into
// `skyhive train MODE …` and says so on warn; other argument lists come
// back unchanged.
func legacyTrainArgs(args []string, warn io.Writer) []string {
	i := 0 // the first positional argument, after the global flags
	for i < len(args) && len(args[i]) > 1 && args[i][0] == '-' {
		if args[i] == "--gemm" || args[i] == "--cpuprofile" {
			i++
		}
		i++
	}
	if i >= len(args) || args[i] != "train" {
		return args
	}
	for j := i + 1; j < len(args); j++ {
		var mode string
		var n int
		switch a := args[j]; {
		case a == "--mode" && j+1 < len(args):
			mode, n = args[j+1], 2
		case len(a) > 7 && a[:7] == "--mode=":
			mode, n = a[7:], 1
		default:
			continue
		}
		out := slices.Concat(args[:i+1], []string{mode}, args[i+1:j], args[j+n:])
		fmt.Fprintf(warn, "skyhive: --mode is retired; running `skyhive train %s` (see skyhive train --help)\n", mode)
		return out
	}
	return args
}

// connectFlags are how a long-running command joins the network: where it
// listens and what it announces, its identity, the swarm's DHT peers, and
// NAT traversal. The flags set the fields of a config's launch.Net.
type connectFlags struct {
	launch.Net
}

// register adds the group; dht describes --dht for this command, which
// has none if dht is empty.
func (c *connectFlags) register(fl *pflag.FlagSet, dht string) {
	fl.StringSliceVar(&c.Listen, "listen", nil, "multiaddrs to listen on (default: all interfaces, TCP and QUIC, free ports)")
	fl.StringSliceVar(&c.Announce, "announce", nil, "multiaddrs to announce instead of the listen addresses (e.g. a public address with a forwarded port)")
	fl.StringVar(&c.Identity, "identity", "", "private key file (created if missing), for a stable peer ID")
	if dht != "" {
		fl.StringSliceVar(&c.DHT, "dht", nil, dht)
		renameFlags(fl, map[string]string{"bootstrap": "dht"})
	}
	fl.StringSliceVar(&c.Relays, "relay", nil, "circuit relays to reserve a slot on when not publicly reachable (multiaddrs ending in /p2p/ID)")
	fl.BoolVar(&c.RelayService, "relay-service", false, "relay connections for peers behind NATs (when publicly reachable)")
	fl.BoolVar(&c.HolePunching, "hole-punching", true, "upgrade relayed connections to direct ones by hole punching (DCUtR)")
	fl.BoolVar(&c.AutoNAT, "autonat", true, "learn this peer's reachability from others (AutoNAT) and answer their probes")
	fl.StringVar(&c.Reachability, "reachability", "auto", "auto (AutoNAT decides), public or private (behind a NAT: use --relay)")
	fl.StringVar(&c.SwarmSecret, "swarm-secret", "", "close the swarm: only peers that know this secret file may talk to this one (skyhive keygen secret)")
	fl.StringVar(&c.SwarmKey, "swarm-key", "", "close the swarm: only peers with a member token signed by this swarm key may talk to this one (the .pub file of skyhive keygen swarm; needs --member-token)")
	fl.StringVar(&c.MemberToken, "member-token", "", "this peer's member token for --swarm-key (skyhive keygen token)")
	fl.IntVar(&c.PendingPerAddress, "pending-per-address", 0, "call requests of one protocol read at once from one address before further ones are told this peer is busy (0: 128; raise it when many honest peers share one address, as behind a NAT)")
	fl.Int64Var(&c.MemoryMiB, "memory-budget", 0, "MiB of memory this process should stay within: Go's soft memory limit; a quarter of it bounds libp2p's connections and streams, an eighth the DHT records this peer stores (0: no limit; libp2p gets an eighth of the machine's memory, the DHT 128 MiB)")
}

// config is the host configuration the flags describe. It also sets the
// process's soft memory limit to the smaller of --memory-budget and what
// the kernel's limits leave (RLIMIT_AS, the cgroup's memory.max), so that
// the garbage collector reclaims memory before the process runs out.
func (c *connectFlags) config() (p2p.Config, error) {
	cfg, err := node.HostConfig(c.Net)
	if err != nil {
		return cfg, flagError(err)
	}
	if b := memlimit.Min(c.MemoryMiB<<20, memlimit.Available().Heap()); b > 0 {
		debug.SetMemoryLimit(b)
	}
	return cfg, nil
}

// seeds parses --dht.
func (c *connectFlags) seeds() ([]peer.AddrInfo, error) {
	s, err := c.Seeds()
	return s, flagError(err)
}

// flagError names the flags behind a launch.FieldError (a config field
// f is the flag --f, with "-" for "_"); other errors come back as they
// are.
func flagError(err error) error {
	var fe *launch.FieldError
	if !errors.As(err, &fe) {
		return err
	}
	return fe.Renamed(func(f string) string { return "--" + strings.ReplaceAll(f, "_", "-") })
}

// flagsGiven says which of a config's fields were given on the command
// line: the field f is the flag --f, with "-" for "_".
func flagsGiven(fl *pflag.FlagSet) func(field string) bool {
	return func(f string) bool { return fl.Changed(strings.ReplaceAll(f, "_", "-")) }
}

// metricsFlags is --metrics ADDR, which every long-running command has:
// serve the process's Prometheus metrics on http://ADDR/metrics.
type metricsFlags struct {
	addr string
}

func (m *metricsFlags) register(fl *pflag.FlagSet) {
	fl.StringVar(&m.addr, "metrics", "", "serve Prometheus metrics on http://ADDR/metrics, e.g. 127.0.0.1:9100 (port 0: a free one; see docs/observability.md)")
}
