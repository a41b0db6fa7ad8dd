package pipeline

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/skyhive/skyhive/alloc"
	"github.com/skyhive/skyhive/p2p"
	"github.com/skyhive/skyhive/stats"
	"github.com/skyhive/skyhive/wire"
)

// probeReq asks a worker to measure its link to Peer (over the address
// given, i.e. the route its activations would take).
type probeReq struct {
	Peer PeerRef `json:"peer"`
}

type probeResp struct {
	Latency   float64 `json:"latency"`   // one-way seconds
	Bandwidth float64 `json:"bandwidth"` // bytes per second, 0 if unmeasurable
}

// measurePing estimates the link from h to peer: latency is half the
// median empty round trip; bandwidth is what a one-way payload adds to
// it, with the payload sized to take about 150 ms (64 KiB to 8 MiB).
func measurePing(ctx context.Context, h p2p.Transport, to peer.AddrInfo) (alloc.Link, error) {
	call := func(payload []byte) (float64, error) {
		cctx, cancel := context.WithTimeout(ctx, 20*time.Second)
		defer cancel()
		t0 := time.Now()
		if _, err := h.Call(cctx, to, ProtoPing, payload); err != nil {
			return 0, err
		}
		return time.Since(t0).Seconds(), nil
	}
	var rtts []float64
	for i := range 6 {
		d, err := call(nil)
		if err != nil {
			return alloc.Link{}, err
		}
		if i > 0 {
			rtts = append(rtts, d)
		}
	}
	rtt := stats.Median(rtts)
	size := 64 << 10
	var bws []float64
	for i := range 4 {
		d, err := call(make([]byte, size))
		if err != nil {
			return alloc.Link{}, err
		}
		extra := d - rtt
		if i == 0 {
			// Size the measured transfers from this first estimate.
			if extra > 0 {
				size = int(min(max(float64(size)/extra*0.15, 64<<10), 8<<20))
			} else {
				size = 8 << 20
			}
			continue
		}
		if extra > 0 {
			bws = append(bws, float64(size)/extra)
		}
	}
	l := alloc.Link{Latency: rtt / 2}
	if len(bws) > 0 {
		l.Bandwidth = stats.Median(bws)
	}
	return l, nil
}

// onProbe measures the link to the requested peer.
func (w *Worker) onProbe(ctx context.Context, b []byte) ([]byte, error) {
	var req probeReq
	if err := decodeHeader(b, &req); err != nil {
		return nil, err
	}
	ai, err := req.Peer.addrInfo()
	if err != nil {
		return nil, err
	}
	if ai.ID == "" || ai.ID == w.tr.ID() {
		return nil, errors.New("pipeline: probe needs another peer")
	}
	if len(ai.Addrs) > 0 {
		pinAddrs(w.tr, ai.ID, ai.Addrs)
	}
	l, err := measurePing(ctx, w.tr, ai)
	if err != nil {
		return nil, err
	}
	return encodeMsg(probeResp{Latency: l.Latency, Bandwidth: l.Bandwidth}, nil)
}

// probe measures the link from worker from (−1: the coordinator) to
// worker to, over the route the pipeline would use.
func (c *Coordinator) probe(ctx context.Context, from, to int) (alloc.Link, error) {
	if from < 0 {
		return measurePing(ctx, c.tr, c.worker(to).peerInfo(c))
	}
	ref, err := c.routeRef(from, to)
	if err != nil {
		return alloc.Link{}, err
	}
	cctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	var resp probeResp
	if _, err := c.call(cctx, from, ProtoProbe, probeReq{Peer: ref}, nil, &resp, wire.Limits{}); err != nil {
		return alloc.Link{}, err
	}
	if !(resp.Latency >= 0) || !(resp.Bandwidth >= 0) {
		return alloc.Link{}, fmt.Errorf("pipeline: bad probe result %+v", resp)
	}
	return alloc.Link{Latency: resp.Latency, Bandwidth: resp.Bandwidth}, nil
}
