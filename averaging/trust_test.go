package averaging

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/skyhive/skyhive/p2p"
	"github.com/skyhive/skyhive/p2p/memnet"
)

// chunkRequest is a well-formed reduce request for session id with a
// 4-element payload.
func chunkRequest(id string, size uint16) []byte {
	b, _ := appendVector((&reduceRequest{Session: id, Hash: 1, Sender: 0, Size: size, Part: 1}).appendHeader(nil), []float32{1, 2, 3, 4}, 0)
	return b
}

// flood sends one reduce request per session ID from p to victim, each
// with a short deadline, and returns how many were refused at once for
// lack of room.
func flood(t *testing.T, p *memnet.Peer, victim *memnet.Peer, ids []string) (refused int) {
	t.Helper()
	var mu sync.Mutex
	var wg sync.WaitGroup
	for _, id := range ids {
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
			defer cancel()
			_, err := p.Call(ctx, victim.AddrInfo(), ReduceProtocol, chunkRequest(id, 2))
			var re *p2p.RemoteError
			if errors.As(err, &re) && strings.Contains(re.Msg, errPending.Error()) {
				mu.Lock()
				refused++
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	return refused
}

func (a *Averager) tableSize() (sessions, pending int) {
	a.mu.Lock()
	defer a.mu.Unlock()
	return len(a.sessions), a.npending
}

// honestRound runs an all-reduce among the swarm's members idx and checks
// it is their exact mean.
func honestRound(t *testing.T, s *testSwarm, id string, idx []int, seed uint64) {
	t.Helper()
	ms := make([]Member, len(idx))
	for k, i := range idx {
		ms[k] = Member{Peer: s.peers[i].AddrInfo(), Weight: 1}
	}
	vs := randomVectors(len(idx), 3000, seed)
	want := exactMean(vs)
	errs := make([]error, len(idx))
	var wg sync.WaitGroup
	for k, i := range idx {
		wg.Go(func() { _, errs[k] = s.avg[i].AllReduce(context.Background(), Session{ID: id, Members: ms}, vs[k]) })
	}
	wg.Wait()
	for k := range idx {
		if errs[k] != nil {
			t.Fatalf("honest member %d: %v", idx[k], errs[k])
		}
		for j, x := range vs[k] {
			if math.Abs(float64(x)-want[j]) > 1e-4 {
				t.Fatalf("honest member %d element %d: %v, want %v", idx[k], j, x, want[j])
			}
		}
	}
}

// One stranger announcing many sessions holds at most its share of the
// table; the victim keeps averaging with honest peers.
func TestSessionFloodFromOnePeerIsBounded(t *testing.T) {
	s := newTestSwarm(t, 3, Config{ChunkElems: 256, Timeout: 4 * time.Second})
	attacker, err := s.net.NewPeer()
	if err != nil {
		t.Fatal(err)
	}
	ids := make([]string, 200)
	for i := range ids {
		ids[i] = fmt.Sprintf("squat/%d", i)
	}
	refused := flood(t, attacker, s.peers[0], ids)
	if sessions, pending := s.avg[0].tableSize(); sessions > DefaultMaxPendingPerPeer || pending > DefaultMaxPendingPerPeer {
		t.Fatalf("one peer holds %d sessions (%d pending), share %d", sessions, pending, DefaultMaxPendingPerPeer)
	}
	// Refusals are immediate; a few calls may instead time out waiting for
	// a handler slot on a loaded machine.
	if refused < len(ids)/2 {
		t.Fatalf("%d of %d refused", refused, len(ids))
	}
	honestRound(t, s, "honest", []int{0, 1, 2}, 1)
}

// Many identities together hold at most half the table, the victim's own
// sessions still join, and an honest member refused while the table is
// full retries until the victim has joined.
func TestSessionFloodFromManyIdentitiesIsBounded(t *testing.T) {
	const maxSessions = 16
	s := newTestSwarm(t, 3, Config{ChunkElems: 256, Timeout: 4 * time.Second, MaxSessions: maxSessions})
	var wg sync.WaitGroup
	for i := range 40 {
		p, err := s.net.NewPeer()
		if err != nil {
			t.Fatal(err)
		}
		wg.Go(func() { flood(t, p, s.peers[0], []string{fmt.Sprintf("sybil/%d/a", i), fmt.Sprintf("sybil/%d/b", i)}) })
	}
	wg.Wait()
	if sessions, pending := s.avg[0].tableSize(); sessions > maxSessions/2 || pending > maxSessions/2 {
		t.Fatalf("%d sessions, %d pending: over half of %d", sessions, pending, maxSessions)
	}
	// Members 1 and 2 start first; their chunks to 0 are refused (the
	// pending table is full) until 0 joins.
	before := s.avg[0].Refused()
	ms := []Member{{Peer: s.peers[0].AddrInfo(), Weight: 1}, {Peer: s.peers[1].AddrInfo(), Weight: 1}, {Peer: s.peers[2].AddrInfo(), Weight: 1}}
	vs := randomVectors(3, 3000, 2)
	want := exactMean(vs)
	errs := make([]error, 3)
	var hw sync.WaitGroup
	for i := 1; i < 3; i++ {
		hw.Go(func() { _, errs[i] = s.avg[i].AllReduce(context.Background(), Session{ID: "late", Members: ms}, vs[i]) })
	}
	deadline := time.Now().Add(3 * time.Second)
	for s.avg[0].Refused() == before && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond) // polling a condition, not timing
	}
	if s.avg[0].Refused() == before {
		t.Fatal("honest chunks for an unjoined session were not refused with the table full")
	}
	_, errs[0] = s.avg[0].AllReduce(context.Background(), Session{ID: "late", Members: ms}, vs[0])
	hw.Wait()
	for i := range 3 {
		if errs[i] != nil {
			t.Fatalf("member %d: %v", i, errs[i])
		}
		for j, x := range vs[i] {
			if math.Abs(float64(x)-want[j]) > 1e-4 {
				t.Fatalf("member %d element %d: %v, want %v", i, j, x, want[j])
			}
		}
	}
}

// Pending sessions expire and finished sessions are freed.
func TestSessionsExpire(t *testing.T) {
	s := newTestSwarm(t, 2, Config{ChunkElems: 256, Timeout: 4 * time.Second})
	var mu sync.Mutex
	now := time.Now()
	s.avg[0].now = func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	honestRound(t, s, "done/1", []int{0, 1}, 3)
	honestRound(t, s, "done/2", []int{0, 1}, 4)
	attacker, err := s.net.NewPeer()
	if err != nil {
		t.Fatal(err)
	}
	flood(t, attacker, s.peers[0], []string{"x/1", "x/2", "x/3", "x/4"})
	if n, _ := s.avg[0].tableSize(); n != 6 {
		t.Fatalf("%d sessions, want 2 finished and 4 pending", n)
	}
	if refused := flood(t, attacker, s.peers[0], []string{"x/5"}); refused != 1 {
		t.Fatal("a fifth pending session accepted")
	}
	mu.Lock()
	now = now.Add(2 * s.avg[0].Config().ReduceWait)
	mu.Unlock()
	if refused := flood(t, attacker, s.peers[0], []string{"x/6"}); refused != 0 {
		t.Fatal("expired sessions still count")
	}
	if n, pending := s.avg[0].tableSize(); n != 1 || pending != 1 {
		t.Fatalf("%d sessions (%d pending) after expiry, want only the new one", n, pending)
	}
}

// A member sending huge values is dropped by the norm check of the
// honest reducers and, as a reducer, its implausible answer is refused: the
// honest members' parts hold the honest mean, its part their own values.
// A member sending non-finite values is left out too.
func TestAttackerContributionIsDropped(t *testing.T) {
	for _, attack := range []string{"huge", "nan"} {
		t.Run(attack, func(t *testing.T) {
			const n, bad, length = 4, 3, 4000
			s := newTestSwarm(t, n, Config{ChunkElems: 300, Timeout: longWait})
			vs := randomVectors(n, length, 5)
			for j := range vs[bad] {
				if attack == "huge" {
					vs[bad][j] = 1e6
				} else if j%100 == 7 {
					vs[bad][j] = float32(math.NaN())
				}
			}
			own := make([][]float32, n)
			for i := range vs {
				own[i] = slices.Clone(vs[i])
			}
			honest := exactMean(vs[:bad])
			// The honest members finish at once; the attacker, whose part
			// the honest members stopped sending to, is closed afterwards.
			res, errs := make([]Result, n), make([]error, n)
			var honestWG, badWG sync.WaitGroup
			sess := s.session("attack", nil)
			for i := range n {
				wg := &honestWG
				if i == bad {
					wg = &badWG
				}
				wg.Go(func() { res[i], errs[i] = s.avg[i].AllReduce(context.Background(), sess, vs[i]) })
			}
			finishes(t, "the honest members", func() struct{} { honestWG.Wait(); return struct{}{} })
			s.avg[bad].Close()
			badWG.Wait()
			bounds, _ := Partition(length, []float64{1, 1, 1, 1})
			for i := range bad {
				if errs[i] != nil {
					t.Fatalf("member %d: %v", i, errs[i])
				}
				if attack == "huge" && !slices.Contains(res[i].Rejected, s.peers[bad].ID()) {
					t.Fatalf("member %d did not reject the attacker: %+v", i, res[i])
				}
				for j, x := range vs[i] {
					want := honest[j]
					if j >= bounds[bad] {
						want = float64(own[i][j]) // the attacker's part
					}
					if math.Abs(float64(x)-want) > 1e-4 {
						t.Fatalf("member %d element %d: %v, want %v", i, j, x, want)
					}
				}
			}
		})
	}
}

// With no attacker the robust rules give the mean: CenteredClip to float
// precision, through the whole all-reduce too.
func TestRobustAggregationWithoutAttacker(t *testing.T) {
	xs := randomVectors(7, 1000, 11)
	want := make([]float32, 1000)
	Mean(want, xs)
	got := make([]float32, 1000)
	CenteredClip(got, xs, 0, DefaultClipIters)
	for j := range want {
		if math.Abs(float64(got[j]-want[j])) > 1e-5 {
			t.Fatalf("CenteredClip element %d: %v, mean %v", j, got[j], want[j])
		}
	}
	for _, agg := range []Aggregation{AggregateCenteredClip, AggregateTrimmedMean} {
		t.Run(string(agg), func(t *testing.T) {
			s := newTestSwarm(t, 5, Config{ChunkElems: 97, Timeout: 4 * time.Second, Aggregation: agg})
			vs := randomVectors(5, 1000, 12)
			for i := range vs { // honest replicas: one model plus small noise
				for j := range vs[i] {
					vs[i][j] = vs[0][j] + 0.01*float32(i)*float32(j%3)
				}
			}
			mean := exactMean(vs)
			_, errs := s.runAll(context.Background(), s.session("robust", nil), vs)
			for i := range vs {
				if errs[i] != nil {
					t.Fatal(errs[i])
				}
				for j, x := range vs[i] {
					// The trimmed mean drops the extremes of each element:
					// within the honest spread of the mean.
					tol := 1e-4
					if agg == AggregateTrimmedMean {
						tol = 0.01
					}
					if math.Abs(float64(x)-mean[j]) > tol {
						t.Fatalf("member %d element %d: %v, mean %v", i, j, x, mean[j])
					}
				}
			}
		})
	}
}

// One attacker among seven contributions: the mean moves by its offset /
// 7, CenteredClip and the trimmed mean stay close to the honest mean, for
// a huge attack and for one just under the norm check's bound.
func TestRobustAggregationWithAttacker(t *testing.T) {
	rng := rand.New(rand.NewPCG(13, 1))
	const n, length = 7, 2000
	xs := randomVectors(n, length, 14)
	honest := make([]float32, length)
	Mean(honest, xs[:n-1])
	spread := 0.0
	for _, x := range xs[:n-1] {
		spread = max(spread, dist(x, honest))
	}
	for _, scale := range []float32{1e6, 8} {
		for j := range xs[n-1] {
			xs[n-1][j] = scale * float32(rng.NormFloat64()+3)
		}
		plain := make([]float32, length)
		Mean(plain, xs)
		for name, f := range map[string]func([]float32){
			"centered-clip": func(d []float32) { CenteredClip(d, xs, 0, DefaultClipIters) },
			"trimmed-mean":  func(d []float32) { TrimmedMean(d, xs, DefaultTrim) },
		} {
			got := make([]float32, length)
			f(got)
			off, meanOff := dist(got, honest), dist(plain, honest)
			t.Logf("scale %g %s: %.3g from the honest mean (mean: %.3g, honest spread %.3g)", scale, name, off, meanOff, spread)
			if off > spread/2 || off >= meanOff {
				t.Fatalf("scale %g %s: %.3g from the honest mean (plain mean %.3g, honest spread %.3g)", scale, name, off, meanOff, spread)
			}
		}
	}
}

func TestParseAggregation(t *testing.T) {
	for _, s := range []string{"", "mean", "centered-clip", "trimmed-mean"} {
		if _, err := ParseAggregation(s); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := ParseAggregation("median"); err == nil {
		t.Fatal("unknown aggregation accepted")
	}
}

// Sparse gradients: where one member's chunk is zero (embedding rows its
// batch did not touch) the other's honest chunk is kept, because the check
// never drops a norm under the reducer's part RMS scaled to the chunk; a
// huge contribution to the same chunk is still dropped.
func TestNormCheckFloorKeepsSparseChunks(t *testing.T) {
	for _, attack := range []bool{false, true} {
		t.Run(fmt.Sprint("attack=", attack), func(t *testing.T) {
			const n, length = 2, 2000
			s := newTestSwarm(t, n, Config{ChunkElems: 100, Timeout: 4 * time.Second})
			vs := randomVectors(n, length, 21)
			bounds, _ := Partition(length, []float64{1, 1})
			// Member 0 reduces [0, 1000): its first chunk is all zero,
			// member 1's is honest (or, attacking, 1000× larger).
			clear(vs[0][:100])
			if attack {
				for j := range 100 {
					vs[1][j] *= 1000
				}
			}
			want := exactMean(vs)
			res, errs := s.runAll(context.Background(), s.session("sparse", nil), vs)
			for i := range n {
				if errs[i] != nil {
					t.Fatal(errs[i])
				}
			}
			dropped := slices.Contains(res[0].Rejected, s.peers[1].ID())
			if dropped != attack {
				t.Fatalf("member 1 dropped: %v, want %v (%+v)", dropped, attack, res[0])
			}
			if !attack {
				for j, x := range vs[0][:bounds[1]] {
					if math.Abs(float64(x)-want[j]) > 1e-5 {
						t.Fatalf("element %d: %v, mean %v", j, x, want[j])
					}
				}
			}
		})
	}
}

// A member that refuses one answered mean as implausible keeps its own
// values for that chunk only: it still sends the rest of the reducer's
// part, so the reducer (honest, refused by mistake) does not wait
// ReduceWait for it and the other chunks are averaged.
func TestRefusedAnswerDoesNotStallTheReducer(t *testing.T) {
	const length = 2000
	cfg := Config{ChunkElems: 100, Window: 1, Timeout: longWait, MaxNormRatio: 10}
	s := newTestSwarm(t, 2, cfg)
	vs := [][]float32{make([]float32, length), make([]float32, length)}
	for j := range length {
		vs[0][j], vs[1][j] = 1, 3
	}
	// Member 1 reduces [1000, 2000). Its first chunk there is 50, so that
	// chunk's mean (25.5) is 25.5× member 0's values: over the ratio of
	// 10, member 0 refuses it.
	for j := 1000; j < 1100; j++ {
		vs[1][j] = 50
	}
	type outcome struct {
		res  []Result
		errs []error
	}
	o := finishes(t, "the all-reduce with a refused answer", func() outcome {
		res, errs := s.runAll(context.Background(), s.session("refused-answer", nil), vs)
		return outcome{res, errs}
	})
	res, errs := o.res, o.errs
	for i, err := range errs {
		if err != nil {
			t.Fatalf("member %d: %v", i, err)
		}
	}
	if !slices.Equal(res[0].Failed, []peer.ID{s.peers[1].ID()}) || len(res[1].Missing) > 0 || len(res[1].Failed) > 0 {
		t.Fatalf("results %+v and %+v: want member 0 to refuse member 1's answer and nothing else", res[0], res[1])
	}
	for j := 1000; j < length; j++ {
		want := float32(2)
		if j < 1100 {
			want = 1 // refused: member 0's own
		}
		if vs[0][j] != want {
			t.Fatalf("member 0 element %d: %v, want %v", j, vs[0][j], want)
		}
	}
}
