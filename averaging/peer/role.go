package peer

import (
	"context"
	"fmt"
	"io"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/skyhive/skyhive/dht"
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
	// file give them, and Config what FromLaunch makes of them.
	Peer   launch.Peer
	Config Config
	// Stdout receives the result; Stderr the progress bar (unless
	// Peer.Quiet) and the notices (nil: discarded).
	Stdout, Stderr io.Writer
	// Stats receives the stats lines (nil: none), e.g. the file Peer.Stats
	// names, which the caller opens.
	Stats io.Writer
	// Metrics, if set, receives the peer's Prometheus collectors, those
	// of its host included (nil: none).
	Metrics prometheus.Registerer
	// Reach, if set, is told where others reach the peer, now and
	// whenever AutoNAT's verdict changes.
	Reach func(p2p.Reach)
}

// RunRole runs an averaging peer (Run) with its typed config, publishing
// its status record every Peer.StatusEvery while it is in the swarm, and
// prints its result on Stdout (one JSON line with Peer.JSON).
func RunRole(ctx context.Context, rc RoleConfig) error {
	if rc.Stdout == nil {
		rc.Stdout = io.Discard
	}
	if rc.Stderr == nil {
		rc.Stderr = io.Discard
	}
	l, c := rc.Peer, rc.Config
	if !l.Quiet {
		c.Progress = rc.Stderr
	}
	c.Log, c.Reach, c.Stats = rc.Stderr, rc.Reach, rc.Stats
	c.Host.Metrics, c.Metrics = rc.Metrics, rc.Metrics
	if status := node.FromLaunch(c.Host, l.Net, l.Process, metrics.RolePeer).Status; status.Every > 0 {
		c.Status = func(ctx context.Context, h *p2p.Host, d *dht.Node, live func() Live) {
			stop := node.PublishStatus(ctx, rc.Stderr, h, d, status, func(s *metrics.Status) {
				liveStatus(s, live(), c.RunID, string(c.Algo))
			})
			<-ctx.Done()
			stop()
		}
	}
	res, err := Run(ctx, c)
	if c.Progress != nil {
		fmt.Fprintln(c.Progress)
	}
	if err != nil {
		return err
	}
	return res.Report(rc.Stdout, l.JSON)
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
