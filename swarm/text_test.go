package swarm

import (
	"strings"
	"testing"
	"time"
)

func TestRunResultWriteText(t *testing.T) {
	acc := 0.8123
	r := &RunResult{Name: "demo", Isolation: "processes", Seconds: 12.34,
		Peers: []PeerResult{
			{Name: "dht0", Role: "dht", Region: "eu", State: "stopped", Starts: 1},
			{Name: "peer1", Role: "peer", Region: "us", NAT: true, State: "exited", Starts: 2, Sent: 2_500_000, TestAccuracy: &acc},
		},
		Events: []Event{{Fired: 1500 * time.Millisecond, Action: "kill", Peer: "peer1", Error: "no such peer"}},
	}
	var b strings.Builder
	r.WriteText(&b, []string{"accuracy: 0.8123 fraction"})
	for _, want := range []string{
		"swarm demo: 12.3 s, isolation processes\n",
		"peer1  peer  us (NAT)  exited   2       81.23%    2.5 ",
		"  at 1.5s: kill peer1: no such peer\n",
		"  accuracy: 0.8123 fraction\n",
	} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, b.String())
		}
	}
	if strings.Contains(b.String(), "router:") {
		t.Errorf("router line without a network:\n%s", b.String())
	}
}
