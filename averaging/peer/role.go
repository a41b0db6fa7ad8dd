package peer

import (
	"context"
	"fmt"
	"io"

	"github.com/skyhive/skyhive/dht"
	"github.com/skyhive/skyhive/jsonl"
	"github.com/skyhive/skyhive/launch"
	"github.com/skyhive/skyhive/metrics"
	"github.com/skyhive/skyhive/node"
	"github.com/skyhive/skyhive/p2p"
)

// FromLaunch turns a peer's typed config into a Config on a host
// configured as host (l.Net as built in-process, see node.FromLaunch): the
// settings ConfigFrom makes, the DHT peers of l.Net to join and the bound
// on the records the peer's DHT node stores. The writers, hooks and
// metrics are left to the caller.
func FromLaunch(l launch.Peer, host p2p.Config) (Config, error) {
	seeds, err := p2p.ParseAddrInfos(l.DHT)
	if err != nil {
		return Config{}, fmt.Errorf("%w: DHT peers: %w", ErrConfig, err)
	}
	c, err := ConfigFrom(l)
	n := node.FromLaunch(host, l.Net, l.Process, metrics.RolePeer)
	c.Host, c.DHT, c.DHTMaxBytes = host, seeds, n.DHT.MaxBytes
	return c, err
}

// RoleConfig configures RunRole: an averaging peer as `skyhive peer` and
// `skyhive @FILE` run one.
type RoleConfig struct {
	// Peer is the peer's options, as the command's flags and a config
	// file give them.
	Peer launch.Peer
	// Host is the configuration of the peer's host, as Peer.Net makes it
	// (node.HostConfig).
	Host p2p.Config
	// Stdout receives the result; Stderr the progress bar (unless
	// Peer.Quiet) and the notices (nil: discarded).
	Stdout, Stderr io.Writer
	// Reach, if set, is told where others reach the peer, now and
	// whenever AutoNAT's verdict changes.
	Reach func(p2p.Reach)
}

// RunRole runs an averaging peer (Run) with its typed config (FromLaunch):
// it appends its stats lines to the file Peer.Stats names, serves its
// Prometheus metrics on Peer.Metrics, publishes its status record every
// Peer.StatusEvery while it is in the swarm, and prints its result on
// Stdout (one JSON line with Peer.JSON). Errors in the options are
// *launch.FieldError.
func RunRole(ctx context.Context, rc RoleConfig) error {
	if rc.Stdout == nil {
		rc.Stdout = io.Discard
	}
	if rc.Stderr == nil {
		rc.Stderr = io.Discard
	}
	l := rc.Peer
	if len(l.DHT) == 0 {
		return &launch.FieldError{Fields: []string{"dht"}, Text: "%s is required: the multiaddr of a `skyhive dht` node or of a peer of the swarm, ending in /p2p/PEER_ID"}
	}
	c, err := FromLaunch(l, rc.Host)
	if err != nil {
		return err
	}
	stats, closeStats, err := jsonl.Open(l.Stats)
	if err != nil {
		return &launch.FieldError{Fields: []string{"stats"}, Text: "%s", Err: err}
	}
	defer closeStats()
	reg, stopMetrics, err := metrics.Start(ctx, l.Metrics, rc.Stderr)
	if err != nil {
		return &launch.FieldError{Fields: []string{"metrics"}, Text: "%s", Err: err}
	}
	defer stopMetrics()
	if !l.Quiet {
		c.Progress = rc.Stderr
	}
	c.Log, c.Reach, c.Stats = rc.Stderr, rc.Reach, stats
	c.Host.Metrics, c.Metrics = reg.Registerer(), reg.Registerer()
	PublishStatus(&c, l, rc.Stderr)
	res, err := Run(ctx, c)
	if c.Progress != nil {
		fmt.Fprintln(c.Progress)
	}
	if err != nil {
		return err
	}
	return res.Report(rc.Stdout, l.JSON)
}

// PublishStatus sets c.Status to publish the peer's signed status record
// in the DHT every l.StatusEvery (none when 0), with its notices on log.
func PublishStatus(c *Config, l launch.Peer, log io.Writer) {
	status := node.FromLaunch(c.Host, l.Net, l.Process, metrics.RolePeer).Status
	if status.Every <= 0 {
		return
	}
	run, algo := c.RunID, string(c.Algo)
	c.Status = func(ctx context.Context, h *p2p.Host, d *dht.Node, live func() Live) {
		stop := node.PublishStatus(ctx, log, h, d, status, func(s *metrics.Status) {
			liveStatus(s, live(), run, algo)
		})
		<-ctx.Done()
		stop()
	}
}

// liveStatus fills an averaging peer's status record from its numbers.
func liveStatus(s *metrics.Status, l Live, run, algo string) {
	st := l.Stats
	s.Step, s.Samples, s.Loss = int64(st.Steps), st.Samples, metrics.Float(l.Loss)
	if e := l.Eval; e != nil && e.Perplexity == 0 {
		s.Accuracy = metrics.Float(e.Accuracy) // language models report perplexity, not accuracy
	}
	s.Averaging = &metrics.AveragingStatus{Run: run, Algo: algo, Round: int64(st.Round),
		Groups: int64(st.Groups + st.GlobalSyncs), GroupMembers: int64(st.GroupMembers),
		Alone: int64(st.Alone), Failures: int64(st.Failures), SwarmPeers: l.Progress.Peers, Epoch: int64(l.Progress.Epoch)}
}
