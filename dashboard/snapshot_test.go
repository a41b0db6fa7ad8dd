package dashboard

import (
	"fmt"
	"testing"
	"time"

	"github.com/skyhive/skyhive/clock/clocktest"
	"github.com/skyhive/skyhive/metrics"
)

func rec(peer, role, region string, at time.Time) metrics.Status {
	return metrics.Status{Peer: peer, Role: role, Region: region, Started: at.Add(-time.Minute), Time: at, PeriodSeconds: 5}
}

func TestHistoryPointsAndForget(t *testing.T) {
	t0 := clocktest.Epoch
	h := newHistory(3, 10, time.Minute)
	for i := range 5 {
		at := t0.Add(time.Duration(i) * time.Second)
		s := rec("peer-a-0123456789", metrics.RolePeer, "eu", at)
		s.Step, s.Loss = int64(i), metrics.Float(1/float64(i+1))
		h.add(at, []metrics.Status{s})
		h.add(at, []metrics.Status{s}) // the same record again adds nothing
	}
	snap := h.build(t0.Add(4*time.Second), false)
	if len(snap.Series) != 1 || len(snap.Series[0].Points) != 3 || snap.Series[0].Points[0].Step != 2 {
		t.Fatalf("series %+v: want the last 3 of 5 points", snap.Series)
	}
	if up := h.build(t0.Add(4*time.Second), true); len(up.Series[0].Points) != 0 || !up.Append {
		t.Fatalf("update after a repeated record: %+v", up.Series)
	}
	h.add(t0.Add(5*time.Second), []metrics.Status{rec("peer-a-0123456789", metrics.RolePeer, "eu", t0.Add(5*time.Second))})
	if up := h.build(t0.Add(5*time.Second), true); len(up.Series[0].Points) != 1 {
		t.Fatalf("update: %+v, want the one new point", up.Series)
	}
	// Not seen for longer than Forget: gone from the snapshot.
	h.add(t0.Add(2*time.Minute), nil)
	if snap := h.build(t0.Add(2*time.Minute), false); len(snap.Peers) != 0 {
		t.Fatalf("forgotten peer still shown: %+v", snap.Peers)
	}
}

func TestHistoryBoundsPeers(t *testing.T) {
	t0 := clocktest.Epoch
	h := newHistory(10, 3, time.Hour)
	for i := range 5 {
		h.add(t0, []metrics.Status{rec(fmt.Sprint("peer-", i), metrics.RoleDHT, "", t0.Add(time.Duration(i)*time.Second))})
	}
	snap := h.build(t0.Add(5*time.Second), false)
	if len(snap.Peers) != 3 || snap.Peers[0].Peer != "peer-2" {
		t.Fatalf("peers %v: want the 3 seen last", snap.Peers)
	}
}

func TestSnapshotSections(t *testing.T) {
	t0 := clocktest.Epoch
	now := t0.Add(10 * time.Second)
	h := newHistory(100, 100, time.Hour)
	a := rec("server-a-000000", metrics.RoleServer, "eu", t0)
	a.Experts = &metrics.ExpertsStatus{Hosted: 2, Loads: []metrics.ExpertLoad{{UID: "ffn.0.0", Calls: 10}, {UID: "ffn.0.1", Calls: 0}}}
	a.Links = []metrics.Link{{Peer: "peer-b-000000", RTTMs: 40}, {Peer: "unknown", RTTMs: 1}}
	b := rec("peer-b-000000", metrics.RolePeer, "us", t0)
	b.Links = []metrics.Link{{Peer: "server-a-000000", RTTMs: 60}}
	b.Averaging = &metrics.AveragingStatus{Run: "r1", Round: 7, Groups: 4, GroupMembers: 10}
	c := rec("peer-c-000000", metrics.RolePeer, "us", t0.Add(-time.Minute)) // gone
	c.Averaging = &metrics.AveragingStatus{Run: "r1", Round: 3}
	c.Links = []metrics.Link{{Peer: "peer-b-000000", RTTMs: 2}}
	d := rec("coord-d-000000", metrics.RoleCoordinator, "", t0)
	d.Pipeline = &metrics.PipelineStatus{Iter: 5, Stages: []metrics.Stage{{Stage: 0, Worker: "w0", First: 0, Last: 3, Compute: 0.1}}}
	h.add(t0, []metrics.Status{a, b, c, d})
	// Ten seconds later server a has answered 50 more calls of ffn.0.0
	// and a replica, server e, hosts ffn.1.0.
	a2 := a
	a2.Time = now
	a2.Experts = &metrics.ExpertsStatus{Hosted: 2, Loads: []metrics.ExpertLoad{{UID: "ffn.0.0", Calls: 60}, {UID: "ffn.0.1", Calls: 0}}}
	e := rec("server-e-000000", metrics.RoleServer, "eu", now)
	e.Experts = &metrics.ExpertsStatus{Hosted: 1, Loads: []metrics.ExpertLoad{{UID: "ffn.1.0", Calls: 3}}}
	h.add(now, []metrics.Status{a2, b, c, d, e})
	snap := h.build(now, false)

	if len(snap.Peers) != 5 {
		t.Fatalf("%d peers", len(snap.Peers))
	}
	if len(snap.Regions) != 3 || snap.Regions[0].Name != "eu" || snap.Regions[2].Name != "" {
		t.Fatalf("regions %+v: want eu, us, then the unnamed", snap.Regions)
	}
	if len(snap.Links) != 2 || snap.Links[0].RTTMs != 2 && snap.Links[1].RTTMs != 2 {
		t.Fatalf("links %+v", snap.Links)
	}
	var eu, us *RegionLink
	for i, l := range snap.RegionLinks {
		switch {
		case l.A == "eu" && l.B == "us":
			eu = &snap.RegionLinks[i]
		case l.A == "us" && l.B == "us":
			us = &snap.RegionLinks[i]
		}
	}
	if eu == nil || eu.RTTMs != 50 || us == nil || us.RTTMs != 2 {
		t.Fatalf("region links %+v: want eu–us 50 ms (the two sides averaged), us–us 2 ms", snap.RegionLinks)
	}
	if len(snap.Grids) != 1 || snap.Grids[0].Rows != 2 || snap.Grids[0].Cols != 2 || len(snap.Grids[0].Cells) != 3 {
		t.Fatalf("grids %+v", snap.Grids)
	}
	cell := snap.Grids[0].Cells[0]
	if cell.UID != "ffn.0.0" || cell.Load != 5 || cell.Calls != 60 || !cell.Alive || snap.Grids[0].MaxLoad != 5 {
		t.Fatalf("cell %+v: want 5 calls/s", cell)
	}
	if last := snap.Grids[0].Cells[2]; last.UID != "ffn.1.0" || last.Row != 1 || last.Col != 0 {
		t.Fatalf("cell %+v: want row 1, column 0", last)
	}
	if len(snap.Pipelines) != 1 || snap.Pipelines[0].Iter != 5 || len(snap.Pipelines[0].Stages) != 1 {
		t.Fatalf("pipelines %+v", snap.Pipelines)
	}
	if len(snap.Runs) != 1 || snap.Runs[0].MaxRound != 7 || len(snap.Runs[0].Peers) != 2 || snap.Runs[0].Peers[0].MeanGroup != 2.5 {
		t.Fatalf("runs %+v", snap.Runs)
	}
	for _, p := range snap.Peers {
		if p.Alive != (p.Peer != "peer-c-000000") {
			t.Errorf("%s alive %v", p.Peer, p.Alive)
		}
	}
}
