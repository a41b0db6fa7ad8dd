package peer

import (
	"crypto/rand"
	"slices"
	"testing"

	"github.com/libp2p/go-libp2p/core/crypto"
	libp2ppeer "github.com/libp2p/go-libp2p/core/peer"
)

func newIDs(t *testing.T, n int) []libp2ppeer.ID {
	t.Helper()
	ids := make([]libp2ppeer.ID, n)
	for i := range ids {
		_, pub, err := crypto.GenerateEd25519Key(rand.Reader)
		if err != nil {
			t.Fatal(err)
		}
		if ids[i], err = libp2ppeer.IDFromPublicKey(pub); err != nil {
			t.Fatal(err)
		}
	}
	slices.Sort(ids)
	return ids
}

func proposal(ids ...libp2ppeer.ID) rosterAnswer {
	s := slices.Clone(ids)
	slices.Sort(s)
	return rosterAnswer{Peers: idStrings(s)}
}

func final(ids ...libp2ppeer.ID) rosterAnswer {
	a := proposal(ids...)
	a.Final = true
	return a
}

func TestJudgeRoster(t *testing.T) {
	ids := newIDs(t, 4)
	a, b, c, s := ids[0], ids[1], ids[2], ids[3]
	sorted := func(x ...libp2ppeer.ID) []libp2ppeer.ID { y := slices.Clone(x); slices.Sort(y); return y }
	for _, tc := range []struct {
		name     string
		live     []libp2ppeer.ID
		answers  map[libp2ppeer.ID]rosterAnswer
		stable   bool
		done     bool
		roster   []libp2ppeer.ID
		excluded bool
	}{
		{name: "agreed twice", live: sorted(a, b), answers: map[libp2ppeer.ID]rosterAnswer{b: proposal(a, b)}, stable: true, done: true, roster: sorted(a, b)},
		{name: "agreed once", live: sorted(a, b), answers: map[libp2ppeer.ID]rosterAnswer{b: proposal(a, b)}},
		{name: "too few", live: sorted(a), answers: nil, stable: true},
		{name: "more than the minimum", live: sorted(a, b, c), answers: map[libp2ppeer.ID]rosterAnswer{b: proposal(a, b, c), c: proposal(a, b, c)}, stable: true, done: true, roster: sorted(a, b, c)},
		{name: "a member sees fewer", live: sorted(a, b, s), answers: map[libp2ppeer.ID]rosterAnswer{b: proposal(a, b), s: proposal(a, b, s)}, stable: true},
		// b agreed on {a, b} and c on nothing else: a saw s late and takes
		// the roster b agreed.
		{name: "takes a final roster", live: sorted(a, b, s), answers: map[libp2ppeer.ID]rosterAnswer{b: final(a, b), s: proposal(a, b, s)}, stable: true, done: true, roster: sorted(a, b)},
		// A final roster some of whose members do not answer it is not
		// taken.
		{name: "a final roster not everyone holds", live: sorted(a, b, c), answers: map[libp2ppeer.ID]rosterAnswer{b: final(a, b, c), c: proposal(a, b, c, s)}, stable: true},
		{name: "agreed without us", live: sorted(a, b, c), answers: map[libp2ppeer.ID]rosterAnswer{b: final(b, c), c: final(b, c)}, stable: true, excluded: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			v := judgeRoster(a, tc.live, tc.answers, tc.stable, 2)
			if v.Done != tc.done || v.Excluded != tc.excluded || !slices.Equal(v.Roster, tc.roster) {
				t.Fatalf("verdict %+v, want done %v excluded %v roster %v", v, tc.done, tc.excluded, tc.roster)
			}
		})
	}
}
