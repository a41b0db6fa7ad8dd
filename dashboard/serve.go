package dashboard

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/skyhive/skyhive/dht"
	"github.com/skyhive/skyhive/metrics"
)

// Serve serves d on ln and polls its source until ctx ends or serving
// fails, then closes d and shuts the server down (waiting up to 5 s for
// open requests). It returns nil when stopped by ctx.
func Serve(ctx context.Context, ln net.Listener, d *Dashboard) error {
	srv := &http.Server{Handler: d, ReadHeaderTimeout: 10 * time.Second}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	polled := make(chan struct{})
	go func() { defer close(polled); _ = d.Run(ctx) }()
	var err error
	select {
	case <-ctx.Done():
	case err = <-served:
	}
	d.Close()
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	_ = srv.Shutdown(sctx)
	cancel()
	<-polled
	if err != nil && !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("dashboard: %w", err)
	}
	return nil
}

// DHTSource reads the swarm's status records through n, joining the DHT
// again through seeds when n has lost all its peers.
func DHTSource(n *dht.Node, seeds []peer.AddrInfo) Source {
	return func(ctx context.Context, now time.Time) ([]metrics.Status, int, error) {
		ss, dropped, err := metrics.ReadStatus(ctx, n, now)
		if err != nil && len(n.Peers()) == 0 {
			if berr := n.Bootstrap(ctx, seeds); berr == nil {
				ss, dropped, err = metrics.ReadStatus(ctx, n, now)
			}
		}
		return ss, dropped, err
	}
}
