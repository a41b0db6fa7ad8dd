package sim

import (
	"context"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/skyhive/skyhive/moe"
	"github.com/skyhive/skyhive/moe/client"
	"github.com/skyhive/skyhive/moe/server"
	"github.com/skyhive/skyhive/tensor"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m,
		goleak.IgnoreAnyFunction("github.com/ipfs/go-log/v2/writer.(*MirrorWriter).logRoutine"),
		goleak.IgnoreAnyFunction("go.opencensus.io/stats/view.(*worker).start"),
	)
}

// A trainer behind the emulated link finds the declared experts and pays
// the round-trip time on its calls.
func TestSwarm(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	grids := []moe.Grid{{Prefix: "a", Size: []int{2, 3}}, {Prefix: "b", Size: []int{4}}}
	sw, err := New(ctx, Config{Grids: grids, Servers: 3, RTT: 40 * time.Millisecond,
		Server: server.Config{Hidden: 8, Lazy: true, DeclareEvery: 200 * time.Millisecond}})
	if err != nil {
		t.Fatal(err)
	}
	defer sw.Close()
	hosted := 0
	for _, s := range sw.Servers {
		hosted += len(s.UIDs())
	}
	if hosted != 10 {
		t.Fatalf("%d experts hosted, want 10", hosted)
	}
	tr, d, err := sw.NewTrainer(ctx)
	if err != nil {
		t.Fatal(err)
	}
	bs, _ := client.NewBeamSearch(d, grids[0], 4, time.Minute)
	m, err := client.New(client.Config{In: 8, Search: bs, Transport: tr, KBest: 6})
	if err != nil {
		t.Fatal(err)
	}
	x := tensor.New(3, 8)
	// Declarations reach the DHT replicas asynchronously: on a loaded
	// machine the first lookup may see only some servers' experts, so
	// look again until all six answer (the deadline only turns a hang
	// into a failure).
	answered, lookups := 0, 0
	for deadline := time.Now().Add(15 * time.Second); answered != 6 && time.Now().Before(deadline); lookups++ {
		if lookups > 0 {
			bs.Invalidate()
			time.Sleep(10 * time.Millisecond)
		}
		_, st, err := m.ForwardCtx(ctx, x)
		if err != nil {
			t.Fatalf("forward: %v", err)
		}
		answered = client.Answered(st)[0]
	}
	if answered != 6 {
		t.Fatalf("%d of 6 experts answered after %d lookups", answered, lookups)
	}
	t0 := time.Now()
	if _, _, err := m.ForwardCtx(ctx, x); err != nil {
		t.Fatal(err)
	}
	if el := time.Since(t0); el < 40*time.Millisecond {
		t.Fatalf("a cached forward took %v, less than the emulated RTT", el)
	}
}
