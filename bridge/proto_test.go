package bridge

import (
	"bytes"
	"encoding/binary"
	"errors"
	"math"
	"strings"
	"testing"
)

func TestCheckParams(t *testing.T) {
	ok := []ParamSpec{{Name: "0.weight", Shape: []int{16, 12}}, {Name: "0.bias", Shape: []int{16}}, {Name: "scale", Shape: nil}}
	if n, err := CheckParams(ok, 1<<20); err != nil || n != 16*12+16+1 {
		t.Fatalf("CheckParams = %d, %v", n, err)
	}
	big := math.MaxInt / 2
	for name, ps := range map[string][]ParamSpec{
		"none":           nil,
		"empty name":     {{Name: "", Shape: []int{1}}},
		"odd name":       {{Name: "a b", Shape: []int{1}}},
		"long name":      {{Name: strings.Repeat("a", MaxNameBytes+1), Shape: []int{1}}},
		"twice":          {{Name: "a", Shape: []int{1}}, {Name: "a", Shape: []int{2}}},
		"zero dimension": {{Name: "a", Shape: []int{3, 0}}},
		"negative":       {{Name: "a", Shape: []int{-1, -1}}},
		"too many dims":  {{Name: "a", Shape: make([]int, MaxDims+1)}},
		"overflow":       {{Name: "a", Shape: []int{big, big, big}}},
		"too large":      {{Name: "a", Shape: []int{1 << 10, 1 << 11}}},
		"sum too large":  {{Name: "a", Shape: []int{1 << 19}}, {Name: "b", Shape: []int{1 << 19}}, {Name: "c", Shape: []int{1}}},
	} {
		if _, err := CheckParams(ps, 1<<20); err == nil {
			t.Errorf("%s: accepted %v", name, ps)
		}
	}
}

func TestReadMessageBounds(t *testing.T) {
	var hdr [4]byte
	binary.BigEndian.PutUint32(hdr[:], MaxMessageBytes+1)
	if _, err := ReadMessage(bytes.NewReader(hdr[:])); !errors.Is(err, ErrProtocol) {
		t.Fatalf("oversized message: %v, want ErrProtocol before reading it", err)
	}
	b, err := EncodeMessage(Message{Op: OpStep, Samples: 8})
	if err != nil {
		t.Fatal(err)
	}
	m, err := ReadMessage(bytes.NewReader(b))
	if err != nil || m.Op != OpStep || m.Samples != 8 {
		t.Fatalf("round trip: %+v, %v", m, err)
	}
	for _, body := range []string{`{}`, `{"op":`, `[1]`, `{"op":"step","samples":"x"}`} {
		if _, err := DecodeMessage([]byte(body)); !errors.Is(err, ErrProtocol) {
			t.Errorf("%s: %v, want ErrProtocol", body, err)
		}
	}
}

func TestDecodeOptions(t *testing.T) {
	l, err := DecodeOptions([]byte(`{"dht":["/ip4/127.0.0.1/tcp/1/p2p/12D3KooWAbc"],"algo":"diloco","inner_steps":1,"outer_momentum":0,"round_interval":"2s"}`))
	if err != nil {
		t.Fatal(err)
	}
	if l.Algo != "diloco" || l.InnerSteps != 1 || l.OuterMomentum != 0 || l.RunID == "" || l.Codec != "none" {
		t.Fatalf("options over the defaults: %+v", l)
	}
	for _, bad := range []string{`{"lr":0.1}`, `{"model":"gpt-mini"}`, `{"no_such_option":1}`, `[1]`, `{"algo":3}`} {
		if _, err := DecodeOptions([]byte(bad)); err == nil {
			t.Errorf("%s accepted", bad)
		}
	}
}

func TestFirstNonFinite(t *testing.T) {
	v := []float32{1, 2, 3}
	if i := firstNonFinite(v); i != -1 {
		t.Fatalf("finite: %d", i)
	}
	for _, bad := range []float32{float32(math.NaN()), float32(math.Inf(1)), float32(math.Inf(-1))} {
		v[1] = bad
		if i := firstNonFinite(v); i != 1 {
			t.Errorf("%v at 1: got %d", bad, i)
		}
	}
}

func FuzzHello(f *testing.F) {
	f.Add([]byte(`{"op":"hello","version":1,"params":[{"name":"w","shape":[3,4]}],"options":{"dht":["x"]}}`))
	f.Add([]byte(`{"op":"hello","params":[{"name":"w","shape":[1099511627776,1099511627776]}]}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := DecodeMessage(b)
		if err != nil {
			return
		}
		if n, err := CheckParams(m.Params, 1<<20); err == nil && (n < 1 || n > 1<<20) {
			t.Fatalf("accepted a model of %d elements", n)
		}
		_, _ = DecodeOptions(m.Options)
	})
}

// FuzzMoEHello: a MoE session's options are accepted only with a layout
// that fits the session's elements, and a call's input shape only when it
// fits the layout.
func FuzzMoEHello(f *testing.F) {
	f.Add([]byte(`{"op":"hello","version":1,"mode":"moe","moe":{"uid_prefix":"ffn","grid_size":[4,2],"in_features":16,"k_best":2}}`), 8, 1, 16)
	f.Add([]byte(`{"op":"hello","mode":"moe","moe":{"uid_prefix":"a.b","grid_size":[65536,65536],"in_features":65536,"max_rows":16384,"k_best":64}}`), 16384, 4, 65536)
	f.Fuzz(func(t *testing.T, b []byte, rows, seq, in int) {
		m, err := DecodeMessage(b)
		if err != nil || m.MoE == nil {
			return
		}
		const maxElements = 1 << 22
		_, lay, err := m.MoE.check(maxElements)
		if err != nil {
			return
		}
		if lay.elements > maxElements || lay.elements < lay.scores || lay.scores < lay.out {
			t.Fatalf("layout %+v accepted for %d elements", lay, maxElements)
		}
		for _, shape := range [][]int{{rows, in}, {rows, seq, in}} {
			r, err := lay.input(shape)
			if err != nil {
				continue
			}
			n := 1
			for _, d := range shape {
				n *= d
			}
			if r != shape[0] || r > lay.rows || n > r*lay.row || shape[len(shape)-1] != lay.in {
				t.Fatalf("input %v accepted by layout %+v", shape, lay)
			}
		}
	})
}
