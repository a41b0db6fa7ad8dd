package dashboard

import (
	"context"
	"fmt"
	"io"
	"net"
	"time"

	"github.com/skyhive/skyhive/launch"
	"github.com/skyhive/skyhive/node"
	"github.com/skyhive/skyhive/p2p"
)

// MinEvery is the shortest period at which Run reads the status records.
const MinEvery = 100 * time.Millisecond

// RunConfig configures Run: a dashboard reading the swarm's DHT as a
// light client, as `skyhive dashboard` runs one. Errors about it are
// *launch.FieldError naming its options (dht, every, listen).
type RunConfig struct {
	// Host is the light client's host configuration.
	Host p2p.Config
	// DHT are the swarm's DHT nodes to read through, multiaddrs ending in
	// /p2p/PEER_ID (required).
	DHT []string
	// Listen is the web page's address (host:port; port 0: a free one).
	Listen string
	// Every is how often the status records are read (at least
	// MinEvery).
	Every time.Duration
	// Timeout bounds joining the DHT.
	Timeout time.Duration
}

// Run serves the dashboard on c.Listen until ctx ends: it joins the DHT
// as a client within c.Timeout (a failure wraps node.ErrJoin), prints the
// page's address on stdout and serves the page (Serve), reading the
// status records every c.Every.
func Run(ctx context.Context, c RunConfig, stdout io.Writer) error {
	if len(c.DHT) == 0 {
		return &launch.FieldError{Fields: []string{"dht"}, Text: "%s is required: the multiaddr of a DHT node of the swarm, ending in /p2p/PEER_ID"}
	}
	if c.Every < MinEvery {
		return &launch.FieldError{Fields: []string{"every"}, Text: fmt.Sprintf("%%s %v: want at least %v", c.Every, MinEvery)}
	}
	ln, err := net.Listen("tcp", c.Listen)
	if err != nil {
		return &launch.FieldError{Fields: []string{"listen"}, Text: "%s", Err: err}
	}
	defer ln.Close()
	jctx, cancel := context.WithTimeout(ctx, c.Timeout)
	n, err := node.New(jctx, node.Config{Host: &c.Host, DHT: node.DHTConfig{Mode: node.DHTClient, Bootstrap: c.DHT, JoinTimeout: c.Timeout}})
	cancel()
	if err != nil {
		return err
	}
	defer n.Close()
	d, err := New(Config{Every: c.Every, Source: DHTSource(n.DHT(), n.Seeds())})
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "dashboard: http://%s/ (Ctrl-C to stop)\n", ln.Addr())
	return Serve(ctx, ln, d)
}
