package pipeline

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/skyhive/skyhive/metrics"
	"github.com/skyhive/skyhive/node"
)

// statusJoinTimeout bounds joining the DHT the coordinator publishes its
// status record through.
const statusJoinTimeout = time.Minute

// CoordinatorNode configures the node a coordinator process runs on,
// beyond its host (CoordinatorConfig.HostConfig).
type CoordinatorNode struct {
	// DHT are peers of a swarm's DHT (multiaddrs ending in /p2p/ID) that
	// the node joins as a client to publish the coordinator's status
	// record through every StatusEvery; with none, or StatusEvery 0, the
	// node runs no DHT. The pipeline does not need the DHT: if it cannot
	// be joined, the node runs without one and says so on Log.
	DHT         []string
	StatusEvery time.Duration
	// Metrics, if set, is the registerer the host and the DHT node report
	// to.
	Metrics prometheus.Registerer
	// Log receives the node's notices.
	Log io.Writer
}

// StartCoordinatorNode starts the node a coordinator of cfg runs on (give
// NewCoordinator its host as cfg.Transport): a host started from
// cfg.HostConfig and, with cn.DHT, a DHT client whose status record is a
// coordinator's in cfg.Region (PublishStatus starts it).
func StartCoordinatorNode(ctx context.Context, cfg CoordinatorConfig, cn CoordinatorNode) (*node.Node, error) {
	hcfg := cfg.HostConfig()
	ncfg := node.Config{Host: &hcfg, DHT: node.DHTConfig{Mode: node.DHTOff}, Metrics: cn.Metrics, Log: cn.Log}
	if len(cn.DHT) == 0 || cn.StatusEvery == 0 {
		return node.New(ctx, ncfg)
	}
	withDHT := ncfg
	withDHT.DHT = node.DHTConfig{Mode: node.DHTClient, Bootstrap: cn.DHT, JoinTimeout: statusJoinTimeout}
	withDHT.Status = node.StatusConfig{Role: metrics.RoleCoordinator, Region: cfg.Region, Every: cn.StatusEvery}
	n, err := node.New(ctx, withDHT)
	if !errors.Is(err, node.ErrJoin) || ctx.Err() != nil {
		return n, err
	}
	if cn.Log != nil {
		fmt.Fprintf(cn.Log, "%v; training without publishing a status record\n", err)
	}
	return node.New(ctx, ncfg)
}

// PublishStatus publishes c's status record through n, if n has a DHT
// and a status period, until n closes: the iterations recorded in live
// (RecordStatus) with the number of workers.
func PublishStatus(n *node.Node, c *Coordinator, live *metrics.Live) error {
	if n.DHT() == nil || n.Config().Status.Every == 0 {
		return nil
	}
	return n.StartStatus(func(s *metrics.Status) {
		live.Sample(s)
		if s.Pipeline != nil {
			ps := *s.Pipeline
			ps.Workers = len(c.Workers())
			s.Pipeline = &ps
		} else {
			s.Pipeline = &metrics.PipelineStatus{Workers: len(c.Workers())}
		}
	})
}

// RecordStatus records st, an iteration of batch examples, in live for
// the status record (nil: none is kept).
func RecordStatus(live *metrics.Live, st IterStats, batch int) {
	live.Update(func(s *metrics.Status) {
		s.Step, s.Samples = int64(st.Iter+1), int64(st.Iter+1)*int64(batch)
		s.Loss, s.Accuracy = metrics.Float(st.Loss), metrics.Float(st.Accuracy)
		ps := &metrics.PipelineStatus{Iter: int64(st.Iter), Plan: st.Gen, Seconds: st.Seconds, Event: st.Event}
		if ps.Event == "" && s.Pipeline != nil {
			ps.Event = s.Pipeline.Event // the last re-plan
		}
		for _, t := range st.Stages {
			ps.Stages = append(ps.Stages, metrics.Stage{Stage: t.Stage, Worker: t.Worker, First: t.First, Last: t.Last,
				Compute: t.Compute, Comm: t.Comm, Idle: t.Idle})
		}
		s.Pipeline = ps
	})
}
