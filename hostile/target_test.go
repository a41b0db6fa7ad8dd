package hostile

import (
	"context"
	"crypto/rand"
	"strings"
	"testing"

	"github.com/libp2p/go-libp2p/core/crypto"
	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/skyhive/skyhive/moe"
	"github.com/skyhive/skyhive/p2p"
)

func testPeer(t *testing.T) peer.AddrInfo {
	t.Helper()
	_, pub, err := crypto.GenerateEd25519Key(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	id, err := peer.IDFromPublicKey(pub)
	if err != nil {
		t.Fatal(err)
	}
	return peer.AddrInfo{ID: id}
}

// TestAttacksFitTheRoles: each role a target plays brings its attacks
// (and a slow sender for each request/response protocol it serves), the
// averaging attacks come once for all members, and only registrations,
// storage floods, crowded keys and Sybil pings may be absorbed.
func TestAttacksFitTheRoles(t *testing.T) {
	server := Target{Peer: testPeer(t), Roles: []string{RoleExpertServer, RoleDHT},
		Experts: []moe.Spec{{UID: "ffn.3", Hidden: 32, InputDims: 2}}}
	members := []Target{
		{Peer: testPeer(t), Roles: []string{RoleDHT, RoleAveraging}},
		{Peer: testPeer(t), Roles: []string{RoleDHT, RoleAveraging}},
	}
	worker := Target{Peer: testPeer(t), Roles: []string{RoleWorker}}
	coord := Target{Peer: testPeer(t), Roles: []string{RoleCoordinator}}
	fast, slow := Attacks(append([]Target{server, worker, coord}, members...))
	count := map[string]int{}
	for _, a := range fast {
		count[a.Name]++
		if a.Absorbed != (a.Name == "dht-storage-flood" || a.Name == "dht-sybil-ping" || a.Name == "dht-crowd-key" || a.Name == "pipeline-register-fake-worker") {
			t.Errorf("%s: absorbed %v", a.Name, a.Absorbed)
		}
		if a.Send == nil || a.Bytes <= 0 {
			t.Errorf("%s: %+v", a.Name, a)
		}
	}
	for name, want := range map[string]int{
		"backward-nan": 1, "dht-erase-dictionary": 3, "squat-nan": 1, "pipeline-acts-512MiB-frame": 1,
		"pipeline-register-fake-worker": 1, "activate-global-2^31-1": 1,
		// expert server, 3 DHT nodes, averaging, worker, coordinator
		"huge-length-prefix": 7,
	} {
		if count[name] != want {
			t.Errorf("%d attacks %q, want %d", count[name], name, want)
		}
	}
	// Expert server, 3 DHT nodes, coordinator, 2 averaging members.
	if len(slow) != 7 {
		t.Errorf("%d slow senders, want 7", len(slow))
	}
	for _, a := range slow {
		if !strings.HasPrefix(a.Name, "slow-loris ") || a.Timeout != SlowTimeout {
			t.Errorf("slow sender %+v", a)
		}
	}
	if fast, slow := Attacks([]Target{{Peer: testPeer(t)}}); len(fast)+len(slow) != 0 {
		t.Errorf("a peer of no role drew %d attacks", len(fast)+len(slow))
	}
}

// TestVerdicts: how Flood counts an answer: accepted, refused (any error,
// a remote one even after the timeout), held (the timeout with no answer)
// or inapplicable; once a victim told an identity it is blocked, that
// identity's held requests to it count as refused (blocked), another's
// do not.
func TestVerdicts(t *testing.T) {
	var f Flood
	const me, other, victim = peer.ID("me"), peer.ID("other"), peer.ID("victim")
	a := Attack{Name: "a", Bytes: 10, Victim: victim}
	f.count(a, me, nil, false)
	f.count(a, me, ErrNotAccepted, false)
	f.count(a, me, &p2p.RemoteError{Msg: "no"}, true)
	f.count(a, me, context.DeadlineExceeded, true)
	f.count(a, me, ErrNotApplicable, false)
	got := f.Tally().ByAttack["a"]
	want := AttackTally{Sent: 5, Accepted: 1, Refused: 2, Unanswered: 1, Inapplicable: 1, Bytes: 50}
	if got != want {
		t.Fatalf("tally %+v, want %+v", got, want)
	}
	f.count(a, me, &p2p.RemoteError{Peer: victim, Msg: "poisoned (the sender is blocked for 10m0s)"}, false)
	f.count(a, me, context.DeadlineExceeded, true)
	f.count(a, other, context.DeadlineExceeded, true)
	got = f.Tally().ByAttack["a"]
	want = AttackTally{Sent: 8, Accepted: 1, Refused: 4, Blocked: 1, Unanswered: 2, Inapplicable: 1, Bytes: 80}
	if got != want {
		t.Fatalf("after the block: tally %+v, want %+v", got, want)
	}
	if b := f.Tally().Breaches(); len(b) != 1 || b[0] != "a" {
		t.Fatalf("breaches %v", b)
	}
}
