package launch

import (
	"errors"
	"strings"
	"testing"
)

func TestNetHostConfigErrorsNameFields(t *testing.T) {
	for _, tc := range []struct {
		net  Net
		want string
	}{
		{Net{MemoryMiB: 10, Reachability: "auto"}, "memory_budget: 10 MiB; give at least 64 MiB, or 0 for no limit"},
		{Net{Reachability: "%s"}, `reachability: want auto, public or private, got "%s"`},
		{Net{Reachability: "auto", Relays: []string{"nonsense"}}, "relay: "},
		{Net{Reachability: "auto", SwarmSecret: "a", SwarmKey: "b"}, "swarm_secret and swarm_key: choose one way to close the swarm"},
		{Net{Reachability: "auto", SwarmSecret: "a", MemberToken: "b"}, "member_token goes with swarm_key, not swarm_secret"},
		{Net{Reachability: "auto", MemberToken: "b"}, "member_token needs swarm_key"},
	} {
		_, err := tc.net.HostConfig()
		var fe *FieldError
		if !errors.As(err, &fe) || !strings.HasPrefix(err.Error(), tc.want) {
			t.Errorf("%+v: got %v, want %q", tc.net, err, tc.want)
			continue
		}
		if r := fe.Renamed(strings.ToUpper).Error(); !strings.HasPrefix(r, strings.ToUpper(fe.Fields[0])) {
			t.Errorf("renamed: %q", r)
		}
	}
	if _, err := (Net{Reachability: "public", MemoryMiB: 128}).HostConfig(); err != nil {
		t.Errorf("valid net: %v", err)
	}
	if _, err := (Net{DHT: []string{"x"}}).Seeds(); err == nil || !strings.HasPrefix(err.Error(), "dht: ") {
		t.Errorf("bad dht: %v", err)
	}
}
