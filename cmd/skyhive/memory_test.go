package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/protocol"

	"github.com/skyhive/skyhive/moe"
	"github.com/skyhive/skyhive/p2p"
	"github.com/skyhive/skyhive/tensor"
	"github.com/skyhive/skyhive/wire"
)

// TestTransformerServerUnderAddressSpaceLimit runs a transformer expert
// server under `prlimit --as=4000000000` and sends it mixes of the largest
// requests it admits, from four identities: concurrent backward passes to
// both experts, a burst of forward passes, and backward passes back to
// back. Before the server planned its memory from the limit, eight
// concurrent backward requests of [12, 1024, 256] (each admitted alone)
// killed it: "fatal error: out of memory" in the attention matrix. Now it
// must survive every mix and answer a normal request afterwards.
func TestTransformerServerUnderAddressSpaceLimit(t *testing.T) {
	if testing.Short() || raceEnabled {
		t.Skip("runs transformer experts on the largest requests for about a minute")
	}
	if _, err := exec.LookPath("prlimit"); err != nil {
		t.Skip("no prlimit (util-linux)")
	}
	out := &syncBuffer{}
	srv := startProgram(t, out, out, []string{"prlimit", "--as=4000000000", os.Args[0], "server", "--expert-type", "transformer",
		"--experts", "t.[0:2]", "--hidden", "256", "--listen", loopback})
	re := regexp.MustCompile(`/ip4/127\.0\.0\.1/tcp/\d+/p2p/\w+`)
	waitFor(t, "the server's address", 30*time.Second, func() bool { return re.MatchString(out.String()) })
	if !strings.Contains(out.String(), "memory budget") {
		t.Fatalf("the server did not plan its memory from the limit:\n%s", out.String())
	}
	to, err := p2p.ParseAddrInfos([]string{re.FindString(out.String())})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 4*time.Minute)
	defer cancel()
	var hosts []*p2p.Host
	for range 4 {
		h, err := p2p.New(ctx, p2p.Config{ListenAddrs: []string{loopback}, MaxMessageBytes: 256 << 20})
		if err != nil {
			t.Fatal(err)
		}
		defer h.Close()
		hosts = append(hosts, h)
	}
	call := func(h *p2p.Host, proto protocol.ID, uid string, msg ...wire.Named) ([]wire.Named, error) {
		req, err := moe.EncodeRequest(uid, msg, wire.Options{})
		if err != nil {
			return nil, err
		}
		resp, err := h.Call(ctx, to[0], proto, req)
		if err != nil {
			return nil, err
		}
		return wire.UnmarshalMessage(resp, wire.Limits{})
	}
	seq := func(b int) *tensor.Tensor {
		x := tensor.New(b, 1024, 256)
		rng := rand.New(rand.NewPCG(uint64(b), 1))
		for i := range x.Data {
			x.Data[i] = float32(rng.NormFloat64())
		}
		return x
	}
	// The largest batch of 1024-token sequences the server admits for a
	// backward pass (its working-memory estimate is checked on the shape).
	largest := 0
	for b := 12; b >= 1 && largest == 0; b-- {
		x := seq(b)
		_, err := call(hosts[0], moe.BackwardProtocol, "t.0", wire.Named{Name: "x", Tensor: x}, wire.Named{Name: "dy", Tensor: x})
		if err == nil || !strings.Contains(err.Error(), "working memory") {
			largest = b
		}
	}
	if largest == 0 {
		t.Fatalf("the server admits no 1024-token sequence:\n%s", tail(out.String()))
	}
	x := seq(largest)
	var mu sync.Mutex
	tally := map[string]int{}
	mix := func(name string, n int, backward bool) {
		var wg sync.WaitGroup
		for i := range n {
			wg.Go(func() {
				h, uid := hosts[i%len(hosts)], fmt.Sprintf("t.%d", i%2)
				var err error
				if backward {
					_, err = call(h, moe.BackwardProtocol, uid, wire.Named{Name: "x", Tensor: x}, wire.Named{Name: "dy", Tensor: x})
				} else {
					_, err = call(h, moe.ForwardProtocol, uid, wire.Named{Name: "x", Tensor: x})
				}
				verdict := "answered"
				if err != nil {
					verdict = "refused: " + err.Error()
					if strings.Contains(err.Error(), "busy") {
						verdict = "busy"
					}
				}
				mu.Lock()
				tally[name+" "+verdict]++
				mu.Unlock()
			})
		}
		wg.Wait()
		select {
		case <-srv.done:
			t.Fatalf("the server died during %s: %v\n%s", name, srv.err, tail(out.String()))
		default:
		}
	}
	mix("8 concurrent backward", 8, true)
	mix("16 concurrent forward", 16, false)
	for i := range 3 {
		mix(fmt.Sprint("back to back ", i), 6, true)
	}
	t.Logf("largest admitted: [%d, 1024, 256]; %v", largest, tally)
	for k := range tally {
		if strings.Contains(k, "refused") {
			t.Errorf("%s: %d", k, tally[k])
		}
	}
	small := tensor.New(2, 16, 256)
	for i := range small.Data {
		small.Data[i] = float32(i%7) / 7
	}
	if _, err := call(hosts[1], moe.BackwardProtocol, "t.1", wire.Named{Name: "x", Tensor: small}, wire.Named{Name: "dy", Tensor: small}); err != nil {
		t.Fatalf("a normal request after the mixes: %v\n%s", err, tail(out.String()))
	}
}
