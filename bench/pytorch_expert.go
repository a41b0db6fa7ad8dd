package bench

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"

	"github.com/skyhive/skyhive/bridge"
	"github.com/skyhive/skyhive/moe/client"
	"github.com/skyhive/skyhive/moe/server"
	"github.com/skyhive/skyhive/p2p"
	"github.com/skyhive/skyhive/tensor"
	"github.com/skyhive/skyhive/wire"
)

// pytorchExpertHidden is the FFN expert of Learning@home's size.
const pytorchExpertHidden = 1024

// pytorchExpert measures an expert server whose expert is a PyTorch module
// (skyhive.experts:ffn, computed by an executor on the CPU) against the
// same expert in Go, both called over libp2p on loopback by one client,
// alternating; and the bridge's share of the executor's calls (the time
// not spent in the module: shared memory, messages, scheduling).
func pytorchExpert(ctx context.Context, o Options) ([]Result, error) {
	hidden := pytorchExpertHidden
	batches := []int{64, 256}
	if o.Quick {
		batches = []int{64}
	}
	reps := max(o.Reps, 5)
	maxB := batches[len(batches)-1]
	env := []string{}
	if exe, err := os.Executable(); err == nil {
		if dir := filepath.Join(filepath.Dir(exe), "..", "python"); isDir(filepath.Join(dir, "skyhive")) {
			env = append(env, "PYTHONPATH="+dir+string(os.PathListSeparator)+os.Getenv("PYTHONPATH"))
		}
	}
	ex, err := bridge.StartExecutor(ctx, bridge.ExecutorConfig{Module: "skyhive.experts:ffn", Python: python(), Device: "cpu",
		Elements: max(3*maxB*hidden, 16*hidden*hidden), Env: env})
	if err != nil {
		return nil, fmt.Errorf("bench pytorch: %w", err)
	}
	defer ex.Close()
	hosts := make([]*p2p.Host, 3)
	for i := range hosts {
		if hosts[i], err = p2p.New(ctx, p2p.Config{ListenAddrs: []string{"/ip4/127.0.0.1/tcp/0"}, MaxMessageBytes: 64 << 20}); err != nil {
			return nil, err
		}
		defer hosts[i].Close()
	}
	lim := wire.Limits{MaxElements: 2 * maxB * hidden}
	goSrv, err := server.New(server.Config{Transport: hosts[0], Experts: []string{"ffn.0"}, Hidden: hidden, Seed: 1, MaxBatch: maxB, Limits: lim})
	if err != nil {
		return nil, err
	}
	defer goSrv.Close()
	torchSrv, err := server.New(server.Config{Transport: hosts[1], Experts: []string{"ffn.0"}, Hidden: hidden, Seed: 1, MaxBatch: maxB, Limits: lim, Executor: ex})
	if err != nil {
		return nil, err
	}
	defer torchSrv.Close()
	goExpert := &client.RemoteExpert{UID: "ffn.0", Peer: hosts[0].AddrInfo(), Transport: hosts[2]}
	torchExpert := &client.RemoteExpert{UID: "ffn.0", Peer: hosts[1].AddrInfo(), Transport: hosts[2]}
	var rs []Result
	for _, b := range batches {
		x, dy := tensor.New(b, hidden), tensor.New(b, hidden)
		tensor.FillNormal(x.Data, rand.New(rand.NewPCG(uint64(b), 1)), 0, 1)
		tensor.FillNormal(dy.Data, rand.New(rand.NewPCG(uint64(b), 2)), 0, 0.01)
		var callErr error
		call := func(e *client.RemoteExpert) func() {
			return func() {
				_, st, err := e.Forward(ctx, x)
				if err == nil {
					_, err = e.Backward(ctx, st, dy)
				}
				if err != nil && callErr == nil {
					callErr = fmt.Errorf("%s: %w", e.Peer.ID, err)
				}
			}
		}
		before := ex.Stats()
		tt, tg, err := TimeAlternating(ctx, reps, 1, call(torchExpert), call(goExpert))
		if err != nil {
			return nil, err
		}
		if callErr != nil {
			return nil, fmt.Errorf("bench pytorch: expert call: %w", callErr)
		}
		after := ex.Stats()
		st, sg := Summarize(tt), Summarize(tg)
		r := Result{Suite: "pytorch", Case: fmt.Sprintf("executor-ffn-fwd+bwd/h%d/b%d", hidden, b), Metric: "samples/s",
			Value: float64(b) / st.Median, Unit: "samples/s", Min: float64(b) / st.Max, Max: float64(b) / st.Min}
		r = r.WithBaseline("go-expert", float64(b)/sg.Median)
		r.Note = "expert server with a PyTorch executor (CPU) vs the same FFN expert in Go; libp2p TCP+TLS on loopback; ratio of medians, alternating A B"
		share := ExecutorDelta(before, after)
		s := Result{Suite: "pytorch", Case: fmt.Sprintf("executor-bridge-share/h%d/b%d", hidden, b), Metric: "share",
			Value: share.BridgeShare(), Unit: "fraction",
			Note: fmt.Sprintf("part of the executor's calls not spent in the module: %.2f ms of %.2f ms per call", 1e3*(share.Seconds-share.ComputeSeconds)/float64(max(share.Calls, 1)), 1e3*share.Seconds/float64(max(share.Calls, 1)))}
		rs = append(rs, r, s)
		o.Logf("pytorch: executor expert batch %d: %.0f samples/s vs Go %.0f (ratio %.3f); bridge share %.3f", b, r.Value, r.BaselineValue, r.Ratio, s.Value)
	}
	return rs, nil
}

// ExecutorDelta is the executor's counters between two snapshots.
func ExecutorDelta(before, after bridge.ExecutorStats) bridge.ExecutorStats {
	return bridge.ExecutorStats{Calls: after.Calls - before.Calls, Seconds: after.Seconds - before.Seconds,
		ComputeSeconds: after.ComputeSeconds - before.ComputeSeconds, Memory: after.Memory}
}
