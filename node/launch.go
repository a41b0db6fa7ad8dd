package node

import (
	"time"

	"github.com/skyhive/skyhive/launch"
	"github.com/skyhive/skyhive/p2p"
)

// FromLaunch is the node a role's launch config describes: host is its
// host's configuration as built in-process from n (its admission keys
// read, see Config.Host), n.DHT the peers it joins, an eighth of n's memory
// budget the bound on the records it stores, p's region and period its
// status record's, of role (a negative period: never), and p.Metrics its
// metrics endpoint. The role sets the DHT mode and what else it needs.
func FromLaunch(host p2p.Config, n launch.Net, p launch.Process, role string) Config {
	return Config{
		Host:        &host,
		DHT:         DHTConfig{Bootstrap: n.DHT, MaxBytes: int(n.MemoryMiB << 20 / 8)},
		Status:      StatusConfig{Role: role, Region: p.Region, Every: max(time.Duration(p.StatusEvery), 0)},
		MetricsAddr: p.Metrics,
	}
}
