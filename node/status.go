package node

import (
	"context"
	"fmt"
	"io"

	"github.com/skyhive/skyhive/clock"
	"github.com/skyhive/skyhive/dht"
	"github.com/skyhive/skyhive/metrics"
	"github.com/skyhive/skyhive/p2p"
)

// PublishStatus publishes the status record of the peer on h through d
// every cfg.Every, with the role's numbers from sample (nil: none), until
// the returned stop is called or ctx ends; stop waits for the publisher.
// Failed stores are reported on log (nil: not reported), once until one
// succeeds. A peer that cannot publish (see metrics.NewPublisher: e.g. an
// identity whose peer ID does not embed its key, which the DHT cannot
// tell is the record's owner) runs without, saying so on log. cfg.Every 0
// publishes nothing.
//
// Node.StartStatus runs it for a node; roles that assemble their own host
// and DHT node call it directly.
func PublishStatus(ctx context.Context, log io.Writer, h *p2p.Host, d *dht.Node, cfg StatusConfig, sample func(*metrics.Status)) (stop func()) {
	if cfg.Every == 0 {
		return func() {}
	}
	if log == nil {
		log = io.Discard
	}
	pub, err := metrics.NewPublisher(metrics.PublisherConfig{
		DHT: d, Peer: h.ID().String(), Role: cfg.Role, Region: cfg.Region, Period: cfg.Every,
		Host: metrics.HostStatus(h), Sample: sample,
	})
	if err != nil {
		fmt.Fprintf(log, "status record: %v; not publishing one\n", err)
		return func() {}
	}
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		failing := false
		for {
			switch err := pub.Publish(ctx); {
			case err == nil:
				failing = false
			case ctx.Err() == nil && !failing:
				failing = true
				fmt.Fprintf(log, "status record: %v (retrying every %v)\n", err, cfg.Every)
			}
			if clock.Sleep(ctx, cfg.Every) != nil {
				return
			}
		}
	}()
	return func() { cancel(); <-done }
}
