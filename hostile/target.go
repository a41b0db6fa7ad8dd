package hostile

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/core/protocol"

	"github.com/skyhive/skyhive/averaging"
	"github.com/skyhive/skyhive/dht"
	"github.com/skyhive/skyhive/moe"
	"github.com/skyhive/skyhive/moe/client"
	"github.com/skyhive/skyhive/p2p"
	"github.com/skyhive/skyhive/pipeline"
)

// Roles a target may play, from the protocols it speaks.
const (
	RoleExpertServer = "expert-server"
	RoleDHT          = "dht"
	RoleAveraging    = "averaging"
	RoleWorker       = "pipeline-worker"
	RoleCoordinator  = "pipeline-coordinator"
)

// roleProtocols maps the protocol that reveals each role.
var roleProtocols = []struct {
	role  string
	proto protocol.ID
}{
	{RoleExpertServer, moe.ForwardProtocol},
	{RoleDHT, dht.ProtocolID},
	{RoleAveraging, averaging.ReduceProtocol},
	{RoleWorker, pipeline.ProtoControl},
	{RoleCoordinator, pipeline.ProtoRegister},
}

// Target is a peer to attack and what a survey learned about it.
type Target struct {
	Peer peer.AddrInfo `json:"-"`
	// ID is Peer.ID as a string, for reports.
	ID string `json:"peer"`
	// Roles are the roles the peer plays, from the protocols it speaks.
	Roles []string `json:"roles"`
	// Experts are the experts an expert server hosts, if it told.
	Experts []moe.Spec `json:"experts,omitempty"`
	// Note says what the survey could not learn, and why.
	Note string `json:"note,omitempty"`
}

// Has reports whether t plays role.
func (t Target) Has(role string) bool { return slices.Contains(t.Roles, role) }

// Survey connects to each peer, reads the protocols it speaks from
// libp2p's identify (which every swarm answers, closed or not), and asks
// expert servers which experts they host. A peer that cannot be reached
// is an error; one that refuses the questions (a closed swarm) is kept
// with a Note.
func Survey(ctx context.Context, h *p2p.Host, peers []peer.AddrInfo) ([]Target, error) {
	out := make([]Target, 0, len(peers))
	for _, p := range peers {
		t := Target{Peer: p, ID: p.ID.String()}
		protos, err := protocolsOf(ctx, h, p)
		if err != nil {
			return nil, err
		}
		for _, r := range roleProtocols {
			if slices.Contains(protos, r.proto) {
				t.Roles = append(t.Roles, r.role)
			}
		}
		if len(t.Roles) == 0 {
			t.Note = "speaks no Skyhive protocol it could be attacked on"
		}
		if t.Has(RoleExpertServer) {
			if t.Experts, err = experts(ctx, h, p); err != nil {
				t.Note = fmt.Sprintf("did not list its experts (%v); attacking expert ffn.0 of hidden size 64", err)
			}
		}
		out = append(out, t)
	}
	return out, nil
}

// protocolsOf connects to p and waits (up to 10 s) for identify to report
// the protocols it speaks.
func protocolsOf(ctx context.Context, h *p2p.Host, p peer.AddrInfo) ([]protocol.ID, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := h.Connect(ctx, p); err != nil {
		return nil, fmt.Errorf("hostile: target %s: %w", p.ID.ShortString(), err)
	}
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		protos, err := h.LibP2P().Peerstore().GetProtocols(p.ID)
		if err == nil && len(protos) > 0 {
			return protos, nil
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("hostile: target %s did not say which protocols it speaks: %w", p.ID.ShortString(), ctx.Err())
		case <-tick.C:
		}
	}
}

// experts asks an expert server for its statistics (which list its
// experts) and each expert for its spec, as a trainer does.
func experts(ctx context.Context, h *p2p.Host, p peer.AddrInfo) ([]moe.Spec, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	raw, err := h.Call(ctx, p, moe.StatsProtocol, nil)
	if err != nil {
		return nil, err
	}
	var st struct {
		Experts []struct {
			UID string `json:"uid"`
		} `json:"experts"`
	}
	if err := json.Unmarshal(raw, &st); err != nil {
		return nil, fmt.Errorf("statistics: %w", err)
	}
	var specs []moe.Spec
	for _, e := range st.Experts {
		s, err := (&client.RemoteExpert{UID: e.UID, Peer: p, Transport: h}).Info(ctx)
		if err != nil {
			return nil, err
		}
		specs = append(specs, s)
	}
	if len(specs) == 0 {
		return nil, errors.New("no experts")
	}
	return specs, nil
}

// Attacks builds the attacks against surveyed targets: quick requests for
// a paced flood (every attack of every role each target plays) and slow
// senders, one per request/response protocol a target serves, for a flood
// of their own (each holds a request for up to SlowTimeout).
func Attacks(targets []Target) (fast, slow []Attack) {
	// Records the expert servers declared, and who owns them, for the
	// DHT attacks.
	var declared []moe.Record
	var owner peer.ID
	var members []averaging.Member
	for _, t := range targets {
		for _, s := range t.Experts {
			if recs, err := moe.Records(s.UID); err == nil {
				declared = append(declared, recs...)
				owner = t.Peer.ID
			}
		}
		if t.Has(RoleAveraging) {
			members = append(members, averaging.Member{Peer: t.Peer, Weight: 1})
		}
	}
	for _, t := range targets {
		if t.Has(RoleExpertServer) {
			spec := moe.Spec{UID: "ffn.0", Hidden: 64, InputDims: 2}
			if len(t.Experts) > 0 {
				spec = t.Experts[0]
			}
			fast = append(fast, ExpertAttacks(t.Peer, spec.UID, spec.Hidden, 16, 1<<16)...)
			slow = append(slow, SlowLoris(t.Peer, moe.ForwardProtocol))
		}
		if t.Has(RoleDHT) {
			fast = append(fast, DHTAttacks(DHTTarget{Node: t.Peer, Declared: declared, Owner: owner})...)
			slow = append(slow, SlowLoris(t.Peer, dht.ProtocolID))
		}
		if t.Has(RoleWorker) {
			fast = append(fast, PipelineWorkerAttacks(t.Peer)...)
		}
		if t.Has(RoleCoordinator) {
			fast = append(fast, PipelineCoordinatorAttacks(t.Peer)...)
			slow = append(slow, SlowLoris(t.Peer, pipeline.ProtoRegister))
		}
	}
	if len(members) > 0 {
		fast = append(fast, AveragingAttacks(AveragingTarget{Members: members,
			Session: func() string { return "hostile-guess" }, VecLen: 1 << 20, ChunkElems: 1 << 16})...)
		for _, m := range members {
			slow = append(slow, SlowLoris(m.Peer, averaging.ReduceProtocol))
		}
	}
	return fast, slow
}
