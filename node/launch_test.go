package node

import (
	"errors"
	"path/filepath"
	"strings"
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

// HostConfig checks a role's network options and names the one at fault
// by its JSON name, which a command renames to its flag.
func TestHostConfigErrorsNameFields(t *testing.T) {
	for _, tc := range []struct {
		net  launch.Net
		want string
	}{
		{launch.Net{MemoryMiB: 10}, "memory_budget: 10 MiB; give at least 64 MiB, or 0 for no limit"},
		{launch.Net{Reachability: "%s"}, `reachability: want auto, public or private, got "%s"`},
		{launch.Net{Relays: []string{"nonsense"}}, "relay: "},
		{launch.Net{SwarmSecret: "a", SwarmKey: "b"}, "swarm_secret and swarm_key: choose one way to close the swarm"},
		{launch.Net{SwarmSecret: "a", MemberToken: "b"}, "member_token goes with swarm_key, not swarm_secret"},
		{launch.Net{MemberToken: "b"}, "member_token needs swarm_key"},
		{launch.Net{SwarmSecret: filepath.Join(t.TempDir(), "missing")}, "swarm_secret: "},
	} {
		_, err := HostConfig(tc.net)
		var fe *launch.FieldError
		if !errors.As(err, &fe) || !strings.HasPrefix(fe.Error(), tc.want) || !errors.Is(err, ErrConfig) {
			t.Errorf("%+v: got %v, want %q", tc.net, err, tc.want)
			continue
		}
		if r := fe.Renamed(strings.ToUpper).Error(); !strings.HasPrefix(r, strings.ToUpper(fe.Fields[0])) {
			t.Errorf("renamed: %q", r)
		}
	}
	c, err := HostConfig(launch.Net{Reachability: "public", MemoryMiB: 128, Relays: []string{"/ip4/127.0.0.1/tcp/1/p2p/12D3KooWHtz3SAKgN44ngiGCvvvWoaPiiymfDZXhSqyjw3q17bWd"}})
	if err != nil || c.Reachability != p2p.ReachabilityPublic || c.MemoryBudget != 32<<20 || !c.RelayClient || len(c.StaticRelays) != 1 || c.Admission != nil {
		t.Errorf("valid net: %+v, %v", c, err)
	}
}
