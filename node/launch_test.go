package node

import (
	"testing"
	"time"

	"github.com/skyhive/skyhive/launch"
	"github.com/skyhive/skyhive/metrics"
	"github.com/skyhive/skyhive/p2p"
)

// FromLaunch carries a role's launch options into its node: the host as
// given, the DHT peers, an eighth of the memory budget for records, the
// status record (a negative period is none) and the metrics endpoint.
func TestFromLaunch(t *testing.T) {
	const seed = "/ip4/127.0.0.1/tcp/4001/p2p/12D3KooWHtz3SAKgN44ngiGCvvvWoaPiiymfDZXhSqyjw3q17bWd"
	host := p2p.Config{ListenAddrs: []string{"/ip4/127.0.0.1/tcp/0"}}
	n := launch.Net{DHT: []string{seed}, MemoryMiB: 256}
	p := launch.Process{Region: "eu", StatusEvery: launch.Duration(5 * time.Second), Metrics: "127.0.0.1:0"}
	c := FromLaunch(host, n, p, metrics.RoleServer)
	if c.Host == nil || c.Host.ListenAddrs[0] != host.ListenAddrs[0] || len(c.DHT.Bootstrap) != 1 || c.DHT.Bootstrap[0] != seed ||
		c.DHT.MaxBytes != 32<<20 || c.MetricsAddr != p.Metrics ||
		c.Status != (StatusConfig{Role: metrics.RoleServer, Region: "eu", Every: 5 * time.Second}) {
		t.Fatalf("got %+v", c)
	}
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	p.StatusEvery = -1
	if c := FromLaunch(host, n, p, metrics.RoleServer); c.Status.Every != 0 {
		t.Fatalf("a negative status period gives %v, want 0 (never)", c.Status.Every)
	}
}
