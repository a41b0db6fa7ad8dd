package node

import (
	"fmt"
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

// HostConfig is the host configuration of a role's network options n (see
// NetConfig.HostConfig): relayed connections accepted, a quarter of n's
// memory budget (at least launch.MinMemoryMiB, or 0 for none) for libp2p,
// the swarm's admission files read. An error wraps a *launch.FieldError
// naming n's field at fault.
func HostConfig(n launch.Net) (p2p.Config, error) {
	if m := n.MemoryMiB; m < 0 || (m > 0 && m < launch.MinMemoryMiB) {
		return p2p.Config{}, configErr(nil, fmt.Sprintf("%s: %d MiB; give at least %d MiB, or 0 for no limit", "%s", m, launch.MinMemoryMiB), "memory_budget")
	}
	c := NetConfig{Listen: n.Listen, Announce: n.Announce, Identity: n.Identity, Relays: n.Relays,
		RelayClient: true, RelayService: n.RelayService, HolePunching: n.HolePunching, AutoNAT: n.AutoNAT,
		Reachability: n.Reachability, SwarmSecret: n.SwarmSecret, SwarmKey: n.SwarmKey, MemberToken: n.MemberToken,
		MemoryBudget: n.MemoryMiB << 20 / 4, PendingPerAddress: n.PendingPerAddress}
	return c.HostConfig()
}
