package averaging

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"
	"go.uber.org/goleak"

	"github.com/skyhive/skyhive/netem"
	"github.com/skyhive/skyhive/p2p/memnet"
	"github.com/skyhive/skyhive/wire"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m,
		goleak.IgnoreAnyFunction("github.com/ipfs/go-log/v2/writer.(*MirrorWriter).logRoutine"),
		goleak.IgnoreAnyFunction("go.opencensus.io/stats/view.(*worker).start"),
	)
}

// testSwarm is n averagers on one memnet network.
type testSwarm struct {
	net   *memnet.Network
	peers []*memnet.Peer
	avg   []*Averager
}

func newTestSwarm(t testing.TB, n int, cfg Config, opts ...memnet.Option) *testSwarm {
	t.Helper()
	s := &testSwarm{net: memnet.NewNetwork(opts...)}
	t.Cleanup(func() { s.net.Close() })
	for range n {
		p, err := s.net.NewPeer()
		if err != nil {
			t.Fatal(err)
		}
		s.peers = append(s.peers, p)
		a := New(p, cfg)
		t.Cleanup(func() { a.Close() })
		s.avg = append(s.avg, a)
	}
	return s
}

func (s *testSwarm) session(id string, weights []float64) Session {
	ms := make([]Member, len(s.peers))
	for i, p := range s.peers {
		w := 1.0
		if weights != nil {
			w = weights[i]
		}
		ms[i] = Member{Peer: p.AddrInfo(), Weight: w}
	}
	return Session{ID: id, Members: ms}
}

func randomVectors(n, length int, seed uint64) [][]float32 {
	rng := rand.New(rand.NewPCG(seed, 1))
	vs := make([][]float32, n)
	for i := range vs {
		vs[i] = make([]float32, length)
		for j := range vs[i] {
			vs[i][j] = float32(rng.NormFloat64()*3 + float64(i))
		}
	}
	return vs
}

func exactMean(vs [][]float32) []float64 {
	m := make([]float64, len(vs[0]))
	for _, v := range vs {
		for j, x := range v {
			m[j] += float64(x)
		}
	}
	for j := range m {
		m[j] /= float64(len(vs))
	}
	return m
}

// runAll runs AllReduce on every member concurrently.
func (s *testSwarm) runAll(ctx context.Context, sess Session, vs [][]float32) ([]Result, []error) {
	res := make([]Result, len(vs))
	errs := make([]error, len(vs))
	var wg sync.WaitGroup
	for i := range vs {
		wg.Go(func() { res[i], errs[i] = s.avg[i].AllReduce(ctx, sess, vs[i]) })
	}
	wg.Wait()
	return res, errs
}

func TestAllReduceIsMean(t *testing.T) {
	ctx := context.Background()
	for n := 2; n <= 16; n++ {
		for _, weighted := range []bool{false, true} {
			t.Run(fmt.Sprintf("n=%d/weighted=%v", n, weighted), func(t *testing.T) {
				s := newTestSwarm(t, n, Config{ChunkElems: 97, Timeout: 10 * time.Second})
				length := 1000 + 37*n
				vs := randomVectors(n, length, uint64(n))
				want := exactMean(vs)
				var weights []float64
				if weighted {
					rng := rand.New(rand.NewPCG(uint64(n), 2))
					weights = make([]float64, n)
					for i := range weights {
						weights[i] = 1 + 9*rng.Float64()
					}
					weights[n-1] = 0 // a member that only contributes
				}
				res, errs := s.runAll(ctx, s.session("mean", weights), vs)
				for i := range vs {
					if errs[i] != nil {
						t.Fatalf("member %d: %v", i, errs[i])
					}
					if res[i].Contributors != n || len(res[i].Failed) != 0 || len(res[i].Missing) != 0 {
						t.Fatalf("member %d: %+v", i, res[i])
					}
					for j, x := range vs[i] {
						if math.Abs(float64(x)-want[j]) > 1e-5*(1+math.Abs(want[j])) {
							t.Fatalf("member %d element %d = %v, want %v", i, j, x, want[j])
						}
					}
				}
			})
		}
	}
}

func TestAllReduceCompressed(t *testing.T) {
	for _, c := range []struct {
		codec wire.Codec
		tol   float64
	}{{wire.CodecFP16, 0.01}, {wire.CodecUniform8, 0.2}, {wire.CodecQuantile8, 0.5}} {
		t.Run(c.codec.String(), func(t *testing.T) {
			n := 5
			s := newTestSwarm(t, n, Config{Codec: c.codec, ChunkElems: 256})
			vs := randomVectors(n, 3000, 7)
			want := exactMean(vs)
			_, errs := s.runAll(context.Background(), s.session("c", nil), vs)
			var worst float64
			for i := range vs {
				if errs[i] != nil {
					t.Fatal(errs[i])
				}
				for j, x := range vs[i] {
					worst = max(worst, math.Abs(float64(x)-want[j]))
					// Every member holds the same (compressed) average.
					if x != vs[0][j] {
						t.Fatalf("members 0 and %d differ at %d: %v vs %v", i, j, vs[0][j], x)
					}
				}
			}
			if worst > c.tol {
				t.Fatalf("max error %v > %v", worst, c.tol)
			}
		})
	}
}

func TestAllReduceRejectsMismatch(t *testing.T) {
	s := newTestSwarm(t, 3, Config{Timeout: 2 * time.Second, ReduceWait: 300 * time.Millisecond})
	vs := randomVectors(3, 500, 3)
	orig := [][]float32{slices.Clone(vs[0]), slices.Clone(vs[1]), slices.Clone(vs[2])}
	a := s.session("mm", nil)
	b := s.session("mm", []float64{1, 2, 1}) // member 2 disagrees on weights
	res := make([]Result, 3)
	var wg sync.WaitGroup
	for i := range 3 {
		sess := a
		if i == 2 {
			sess = b
		}
		wg.Go(func() { res[i], _ = s.avg[i].AllReduce(context.Background(), sess, vs[i]) })
	}
	wg.Wait()
	// Every side reports the others as disagreeing (alive, with another
	// view of the session), not as failed or missing.
	if len(res[2].Disagreed) != 2 || len(res[2].Failed)+len(res[2].Missing) != 0 {
		t.Fatalf("disagreeing member: %+v", res[2])
	}
	// Members 0 and 1 agree with each other: they average between them
	// on their parts, without member 2.
	for i := range 2 {
		if !slices.Equal(res[i].Disagreed, []peer.ID{s.peers[2].ID()}) || len(res[i].Failed)+len(res[i].Missing) != 0 {
			t.Fatalf("member %d: %+v", i, res[i])
		}
	}
	if m := (orig[0][0] + orig[1][0]) / 2; vs[0][0] != m || vs[1][0] != m {
		t.Fatalf("members 0 and 1 did not average their part 0: %v %v, want %v", vs[0][0], vs[1][0], m)
	}
}

// killLink kills victim once it has sent `after` messages.
type killLink struct {
	inner  *netem.NICLink
	net    *memnet.Network
	victim peer.ID
	after  int

	mu   sync.Mutex
	sent int
}

func (k *killLink) Deliver(ctx context.Context, from, to peer.ID, size int) error {
	if from == k.victim {
		k.mu.Lock()
		k.sent++
		kill := k.sent == k.after
		k.mu.Unlock()
		if kill {
			k.net.Kill(k.victim)
		}
	}
	return k.inner.Deliver(ctx, from, to, size)
}

func TestAllReducePeerKilledMidway(t *testing.T) {
	for _, blackhole := range []bool{false, true} {
		t.Run(fmt.Sprintf("blackhole=%v", blackhole), func(t *testing.T) {
			const n, victim = 5, 2
			link := &killLink{inner: netem.NewNICLink(200e6, time.Millisecond), victim: "", after: 6}
			opts := []memnet.Option{memnet.WithLink(link)}
			if blackhole {
				opts = append(opts, memnet.WithBlackhole())
			}
			// Generous: a reducer leaves out members whose chunks arrive
			// after ReduceWait (documented), which a CPU-starved test
			// run (go test ./... on 2 cores) can otherwise provoke.
			timeout := 4 * time.Second
			s := newTestSwarm(t, n, Config{ChunkElems: 512, Timeout: timeout, ReduceWait: 2 * time.Second}, opts...)
			link.net, link.victim = s.net, s.peers[victim].ID()
			vs := make([][]float32, n)
			for i := range vs {
				vs[i] = make([]float32, 20000)
				for j := range vs[i] {
					vs[i][j] = float32(i + 1)
				}
			}
			start := time.Now()
			res, errs := s.runAll(context.Background(), s.session("kill", nil), vs)
			elapsed := time.Since(start)
			// Timeout bounds the call; the margin is for a loaded
			// machine, the check for calls that hang in the blackhole.
			if elapsed > timeout+20*time.Second {
				t.Fatalf("all-reduce took %v with timeout %v", elapsed, timeout)
			}
			bounds, _ := Partition(20000, []float64{1, 1, 1, 1, 1})
			// mean over survivors (1,2,4,5) and over everyone
			survMean, allMean := float32(12)/4, float32(15)/5
			for i := range n {
				if i == victim {
					continue
				}
				if errs[i] != nil {
					t.Fatalf("survivor %d: %v", i, errs[i])
				}
				if !slices.Contains(res[i].Failed, s.peers[victim].ID()) && !slices.Contains(res[i].Missing, s.peers[victim].ID()) {
					t.Fatalf("survivor %d did not notice the victim: %+v", i, res[i])
				}
				for p := range n {
					for j := bounds[p]; j < bounds[p+1]; j++ {
						x := vs[i][j]
						ok := x == survMean || x == allMean
						if p == victim {
							ok = ok || x == float32(i+1) // the victim's part stays local
						} else if x != vs[(victim+1)%n][j] && (victim+1)%n != i {
							t.Fatalf("survivors disagree on part %d element %d", p, j)
						}
						if !ok {
							t.Logf("res %+v", res[i])
							t.Fatalf("survivor %d part %d element %d = %v", i, p, j, x)
						}
					}
				}
			}
		})
	}
}

// raceEnabled is set under the race detector, which makes timing tests meaningless.
var raceEnabled bool

// TestAllReduceBandwidthBound checks that the butterfly all-reduce sends
// each member's share of the optimum, 2·(n−1)/n of the vector, counted
// on the link (which a loaded machine does not change), and that over
// emulated NICs it is no faster than that many bytes allow.
func TestAllReduceBandwidthBound(t *testing.T) {
	if testing.Short() || raceEnabled {
		t.Skip("moves 16 MiB per member")
	}
	const n, elems = 4, 4 << 20 // 16 MiB
	bw := 1e9
	link := &sentBytes{inner: netem.NewNICLink(bw, 0), sent: map[peer.ID]int64{}}
	s := newTestSwarm(t, n, Config{}, memnet.WithLink(link))
	vs := randomVectors(n, elems, 5)
	optimum := 2 * float64(n-1) / n * elems * 4
	bound := optimum * 8 / bw
	start := time.Now()
	_, errs := s.runAll(context.Background(), s.session("bw", nil), vs)
	for _, err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	if el := time.Since(start).Seconds(); el < bound*0.98 {
		t.Fatalf("faster than the bandwidth bound: %v < %v", el, bound)
	}
	for _, p := range s.peers {
		got := float64(link.of(p.ID()))
		t.Logf("%s sent %.0f bytes, %.3f of the optimum", p.ID().ShortString(), got, got/optimum)
		// Headers and leave notices cost a little more than the optimum.
		if got < optimum || got > 1.01*optimum {
			t.Errorf("%s sent %.0f bytes, the optimum is %.0f", p.ID().ShortString(), got, optimum)
		}
	}
}

// sentBytes is a link that counts the bytes each peer sends.
type sentBytes struct {
	inner memnet.Link
	mu    sync.Mutex
	sent  map[peer.ID]int64
}

func (l *sentBytes) Deliver(ctx context.Context, from, to peer.ID, size int) error {
	l.mu.Lock()
	l.sent[from] += int64(size)
	l.mu.Unlock()
	return l.inner.Deliver(ctx, from, to, size)
}

func (l *sentBytes) of(p peer.ID) int64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.sent[p]
}

// ban at ReduceWait drops a member that went quiet while missing from a
// chunk the others sent, but not the members still sending, nor anyone for
// a chunk no other member has sent yet.
func TestBanStalledMember(t *testing.T) {
	const n = 4 // self is 0; member 3 sent chunk 0, then died
	newChunk := func() *chunk {
		c := &chunk{sum: []float32{0}, from: make([]bool, n), count: 1, done: make(chan struct{})}
		c.from[0] = true
		return c
	}
	s := &session{self: 0, chunks: []*chunk{newChunk(), newChunk(), newChunk()},
		contributed: make([]bool, n), lastSeen: make([]time.Time, n), banned: make([]bool, n), quiet: time.Minute}
	s.contributed[0] = true
	for _, j := range []int{1, 2, 3} {
		s.add(s.chunks[0], j, []float32{1})
	}
	s.lastSeen[3] = time.Now().Add(-2 * time.Minute)
	for _, j := range []int{1, 2} {
		s.add(s.chunks[1], j, []float32{1})
	}
	s.lastSeen[2] = time.Now().Add(-2 * time.Minute) // quiet, but not missing from chunk 1
	s.ban(false)
	if !slices.Equal(s.banned, []bool{false, false, false, true}) {
		t.Fatalf("banned %v, want only member 3", s.banned)
	}
	if s.chunks[1].resp == nil || s.chunks[1].count != 3 {
		t.Fatalf("chunk 1 not final with 3 contributions: count %d", s.chunks[1].count)
	}
	if s.chunks[2].resp != nil {
		t.Fatal("chunk 2, which no other member has sent, was finalized")
	}
}

// TestLeaveNoticeEndsWaitAtOnce: a member that is stopped mid-session tells
// the others, who then finish without it at once instead of waiting for
// ReduceWait, whether they had joined the session yet or not.
func TestLeaveNoticeEndsWaitAtOnce(t *testing.T) {
	s := newTestSwarm(t, 3, Config{Timeout: longWait, ChunkElems: 50})
	sess := s.session("leave", nil)
	vecs := constVectors(3, 300)
	// Member 2 joins, then is stopped before the others arrive.
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { _, err := s.avg[2].AllReduce(ctx, sess, vecs[2]); done <- err }()
	waitJoined(t, s.avg[2], sess.ID)
	cancel()
	if err := <-done; err == nil {
		t.Fatal("the stopped member's all-reduce succeeded")
	}
	finishes(t, "the others, after the leave notice", s.reduceFirst(t, 2, sess, vecs))
	// Parts 0 and 1 are the mean of members 0 and 1; member 2's part stays local.
	for i := range 2 {
		if vecs[i][0] != 0.5 || vecs[i][150] != 0.5 {
			t.Fatalf("member %d: %v %v, want 0.5", i, vecs[i][0], vecs[i][150])
		}
	}
}

// TestDeclineEndsWaitAtOnce: a member that declines a session (busy)
// tells the others, who finish without it at once, list it as Declined
// rather than Missing or Failed, and keep their own values for its part,
// whether the decline came before they joined or while they waited; the
// decliner cannot join the session afterwards.
func TestDeclineEndsWaitAtOnce(t *testing.T) {
	for _, early := range []bool{true, false} {
		s := newTestSwarm(t, 3, Config{Timeout: longWait, ChunkElems: 50})
		sess := s.session(fmt.Sprintf("decline-%v", early), nil)
		vecs := constVectors(3, 300)
		decline := func() {
			if err := s.avg[2].Decline(context.Background(), sess, len(vecs[2])); err != nil {
				t.Error(err)
			}
		}
		if early {
			decline()
		}
		wait := s.reduceFirst(t, 2, sess, vecs)
		if !early {
			// The others wait for member 2 when it declines.
			waitJoined(t, s.avg[0], sess.ID)
			waitJoined(t, s.avg[1], sess.ID)
			decline()
		}
		res := finishes(t, fmt.Sprintf("early %v: the others, after the decline", early), wait)
		for i := range 2 {
			r := res[i]
			if len(r.Declined) != 1 || r.Declined[0] != s.peers[2].ID() || len(r.Missing) != 0 || len(r.Failed) != 0 {
				t.Fatalf("early %v: member %d: declined %v missing %v failed %v", early, i, r.Declined, r.Missing, r.Failed)
			}
			// Parts 0 and 1 are the mean of members 0 and 1; member 2's
			// part keeps each member's own values.
			if vecs[i][0] != 0.5 || vecs[i][150] != 0.5 || vecs[i][250] != float32(i) {
				t.Fatalf("early %v: member %d: %v %v %v", early, i, vecs[i][0], vecs[i][150], vecs[i][250])
			}
		}
		if _, err := s.avg[2].AllReduce(context.Background(), sess, vecs[2]); !errors.Is(err, ErrDeclined) {
			t.Fatalf("early %v: joining a declined session: %v, want ErrDeclined", early, err)
		}
	}
}

// TestDisagreeingMemberListsAreReported: a member whose list of the
// session leaves someone out (it gave up on a peer the others have not)
// is reported as Disagreed, not Missing or Failed, by the others, and
// reports the member it lists so too; nobody waits ReduceWait for it, and the members
// that agree still average.
func TestDisagreeingMemberListsAreReported(t *testing.T) {
	s := newTestSwarm(t, 3, Config{Timeout: longWait, ChunkElems: 50})
	full := s.session("views", nil)
	short := Session{ID: full.ID, Members: []Member{full.Members[0], full.Members[2]}}
	vecs := constVectors(3, 300)
	var wg sync.WaitGroup
	res := make([]Result, 3)
	for i := range 3 {
		wg.Go(func() {
			sess := full
			if i == 2 {
				sess = short
			}
			var err error
			if res[i], err = s.avg[i].AllReduce(context.Background(), sess, vecs[i]); err != nil {
				t.Error(err)
			}
		})
	}
	finishes(t, "the members that disagree", func() struct{} { wg.Wait(); return struct{}{} })
	id := func(i int) peer.ID { return s.peers[i].ID() }
	// Member 2 lists member 0 and hears of member 1 only if member 1's
	// chunk arrives before member 2's all-reduce ends.
	for i, want := range [][]peer.ID{{id(2)}, {id(2)}, {id(0)}} {
		r := res[i]
		got := slices.DeleteFunc(slices.Clone(r.Disagreed), func(p peer.ID) bool { return i == 2 && p == id(1) })
		if !slices.Equal(got, want) || len(r.Missing) != 0 || len(r.Failed) != 0 {
			t.Fatalf("member %d: disagreed %v (want %v), missing %v, failed %v", i, r.Disagreed, want, r.Missing, r.Failed)
		}
	}
	for i := range 2 {
		if vecs[i][0] != 0.5 || vecs[i][150] != 0.5 || vecs[i][250] != float32(i) {
			t.Fatalf("member %d: %v %v %v", i, vecs[i][0], vecs[i][150], vecs[i][250])
		}
	}
}

// reduceFirst starts the all-reduce of sess on members 0..k-1 with their
// vectors and returns a function that waits for them and returns their
// results.
func (s *testSwarm) reduceFirst(t *testing.T, k int, sess Session, vecs [][]float32) func() []Result {
	res := make([]Result, k)
	var wg sync.WaitGroup
	for i := range k {
		wg.Go(func() {
			var err error
			if res[i], err = s.avg[i].AllReduce(context.Background(), sess, vecs[i]); err != nil {
				t.Error(err)
			}
		})
	}
	return func() []Result { wg.Wait(); return res }
}

// longWait is the Timeout of the tests that check that something ends a
// wait at once: their ReduceWait (half of it) is minutes, so a test that
// waits for it fails by finishes' bound, however loaded the machine.
const longWait = 20 * time.Minute

// finishes returns wait's result, failing the test if wait has not
// returned within a minute: a bound that only a wait for ReduceWait
// (minutes under longWait) reaches, not a timing.
func finishes[T any](t *testing.T, what string, wait func() T) T {
	t.Helper()
	done := make(chan T, 1)
	go func() { done <- wait() }()
	select {
	case r := <-done:
		return r
	case <-time.After(time.Minute):
		t.Fatalf("%s did not finish within a minute: they wait for ReduceWait", what)
		var zero T
		return zero
	}
}

// waitJoined waits until a has joined the session id.
func waitJoined(t *testing.T, a *Averager, id string) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		a.mu.Lock()
		sess := a.sessions[id]
		a.mu.Unlock()
		if sess != nil {
			select {
			case <-sess.joined:
				return
			default:
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s did not join session %q", a.t.ID(), id)
		}
		time.Sleep(time.Millisecond)
	}
}

// constVectors returns n vectors of the given length, vector i all i.
func constVectors(n, length int) [][]float32 {
	vs := make([][]float32, n)
	for i := range vs {
		vs[i] = make([]float32, length)
		for j := range vs[i] {
			vs[i][j] = float32(i)
		}
	}
	return vs
}

// dropOnce fails the first large message (a chunk) from one member to
// another, as a lost stream or a failed dial would.
type dropOnce struct {
	from, to peer.ID
	mu       sync.Mutex
	dropped  int
}

func (d *dropOnce) Deliver(_ context.Context, from, to peer.ID, size int) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if from == d.from && to == d.to && size > 1000 && d.dropped == 0 {
		d.dropped++
		return errors.New("link: stream reset")
	}
	return nil
}

// TestAllReduceRetriesALostChunk: a chunk whose call fails in transport is
// sent once more, so the all-reduce completes with every member.
func TestAllReduceRetriesALostChunk(t *testing.T) {
	link := &dropOnce{}
	s := newTestSwarm(t, 3, Config{ChunkElems: 500, Timeout: longWait}, memnet.WithLink(link))
	link.from, link.to = s.peers[0].ID(), s.peers[1].ID()
	vs := randomVectors(3, 3000, 5)
	want := exactMean(vs)
	sess := s.session("retry", nil)
	res := make([]Result, 3)
	errs := make([]error, 3)
	var wg sync.WaitGroup
	for i := range 3 {
		wg.Go(func() { res[i], errs[i] = s.avg[i].AllReduce(context.Background(), sess, vs[i]) })
	}
	finishes(t, "the all-reduce with a lost chunk", func() struct{} { wg.Wait(); return struct{}{} })
	if link.dropped != 1 {
		t.Fatalf("no chunk was dropped (%d)", link.dropped)
	}
	for i := range 3 {
		if errs[i] != nil || len(res[i].Failed) > 0 || len(res[i].Missing) > 0 {
			t.Fatalf("member %d: %+v %v", i, res[i], errs[i])
		}
		for j, x := range vs[i] {
			if math.Abs(float64(x)-want[j]) > 1e-4 {
				t.Fatalf("member %d element %d = %v, want %v", i, j, x, want[j])
			}
		}
	}
}
