package averaging

import (
	"bytes"
	"testing"
)

func FuzzReduceRequest(f *testing.F) {
	f.Add((&reduceRequest{Session: "s", Hash: 7, Sender: 1, Size: 3, Part: 2, Chunk: 4, Payload: []byte("xyz")}).marshal())
	f.Add([]byte("SKA\x01"))
	f.Fuzz(func(t *testing.T, b []byte) {
		r, err := unmarshalReduceRequest(b)
		if err != nil {
			return
		}
		if !bytes.Equal(r.marshal(), b) {
			t.Fatalf("round trip differs")
		}
		_, _ = decodeVector(r.Payload, 16)
	})
}

func FuzzReduceResponse(f *testing.F) {
	f.Add(marshalReduceResponse(2, []byte("SKT")), 4)
	f.Fuzz(func(t *testing.T, b []byte, size int) {
		c, p, err := unmarshalReduceResponse(b, size)
		if err == nil && (c < 1 || c > size || len(p) != len(b)-2) {
			t.Fatalf("accepted %d contributors of %d", c, size)
		}
	})
}

func FuzzLeave(f *testing.F) {
	f.Add(leaveNotice{Session: "run/g/3", Hash: 9}.marshal())
	f.Add(leaveNotice{Session: "run/w/4/1", Hash: 7, Decline: true}.marshal())
	f.Fuzz(func(t *testing.T, b []byte) {
		l, err := unmarshalLeave(b)
		if err == nil && !bytes.Equal(l.marshal(), b) {
			t.Fatalf("round trip differs")
		}
	})
}

func TestPartitionAndButterfly(t *testing.T) {
	b, err := Partition(10, []float64{1, 1, 1})
	if err != nil || b[0] != 0 || b[3] != 10 || b[1]-b[0] != 4 {
		t.Fatalf("%v %v", b, err)
	}
	if _, err := Partition(10, []float64{0, 0}); err == nil {
		t.Fatal("all-zero weights accepted")
	}
	// 16 ranks, S=4: two windows; groups in each round partition the ranks
	// and rounds 0 and 1 group differently.
	for round := range 2 {
		seen := map[int]int{}
		for r := range 16 {
			g, idx, err := ButterflyGroup(r, 16, 4, round)
			if err != nil || len(g) != 4 {
				t.Fatalf("rank %d: %v %v", r, g, err)
			}
			for _, m := range g {
				if prev, ok := seen[m]; ok && prev != idx {
					t.Fatalf("rank %d in two groups", m)
				}
				seen[m] = idx
			}
		}
	}
	g0, _, _ := ButterflyGroup(5, 16, 4, 0)
	g1, _, _ := ButterflyGroup(5, 16, 4, 1)
	if g0[0] != 4 || g1[0] != 1 || g1[1] != 5 || g1[2] != 9 {
		t.Fatalf("groups %v %v", g0, g1)
	}
	// 10 ranks (not a power of 3), S=3: every group holds the rank and at most 3.
	for r := range 10 {
		for round := range 3 {
			g, _, err := ButterflyGroup(r, 10, 3, round)
			if err != nil || len(g) > 3 || len(g) < 1 {
				t.Fatalf("%v %v", g, err)
			}
		}
	}
}
