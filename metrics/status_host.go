package metrics

import (
	"context"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/p2p/protocol/ping"

	"github.com/skyhive/skyhive/p2p"
)

// pingsPerCall bounds the peers HostStatus pings each time it is called,
// and pingTimeout each ping.
const (
	pingsPerCall = 4
	pingTimeout  = 2 * time.Second
)

// HostStatus returns a PublisherConfig.Host for h: its addresses (public
// ones first) and reachability, and its links: the connected peers whose
// round-trip time libp2p knows, fastest first. Each call pings a few
// connected peers in turn (libp2p's ping protocol), which keeps those
// times fresh.
func HostStatus(h *p2p.Host) func(context.Context) HostInfo {
	var (
		mu   sync.Mutex
		next peer.ID // round-robin position among the connected peers
	)
	return func(ctx context.Context) HostInfo {
		r := h.Reach()
		addrs := slices.Clone(r.Addrs)
		slices.SortStableFunc(addrs, func(a, b string) int { return addrRank(a) - addrRank(b) })
		info := HostInfo{Addrs: addrs, Reach: r.Status}
		lh := h.LibP2P()
		conns := lh.Network().Peers()
		slices.Sort(conns)
		mu.Lock()
		i, _ := slices.BinarySearch(conns, next)
		var batch []peer.ID
		for k := 0; k < min(pingsPerCall, len(conns)); k++ {
			batch = append(batch, conns[(i+k)%len(conns)])
		}
		if len(batch) > 0 {
			next = batch[len(batch)-1] + "\x00" // just after the last one pinged
		}
		mu.Unlock()
		pctx, cancel := context.WithTimeout(ctx, pingTimeout)
		var wg sync.WaitGroup
		for _, p := range batch {
			wg.Go(func() {
				// A result records the round trip in the peerstore.
				select {
				case <-ping.Ping(pctx, lh, p):
				case <-pctx.Done():
				}
			})
		}
		wg.Wait()
		cancel()
		ps := lh.Peerstore()
		for _, p := range conns {
			if d := ps.LatencyEWMA(p); d > 0 {
				info.Links = append(info.Links, Link{Peer: p.String(), RTTMs: float64(d) / float64(time.Millisecond)})
			}
		}
		slices.SortStableFunc(info.Links, func(a, b Link) int { return cmpFloat(a.RTTMs, b.RTTMs) })
		info.Links = info.Links[:min(len(info.Links), MaxLinks)]
		return info
	}
}

// addrRank orders addresses for a record: public, then private, then
// relayed, then loopback ones.
func addrRank(a string) int {
	switch {
	case strings.Contains(a, "/p2p-circuit"):
		return 2
	case strings.HasPrefix(a, "/ip4/127.") || strings.HasPrefix(a, "/ip6/::1/"):
		return 3
	case strings.HasPrefix(a, "/ip4/10.") || strings.HasPrefix(a, "/ip4/192.168.") || strings.HasPrefix(a, "/ip4/172."):
		return 1
	}
	return 0
}
