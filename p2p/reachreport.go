package p2p

import (
	"context"
	"encoding/json"
	"fmt"
	"io"

	ma "github.com/multiformats/go-multiaddr"
	manet "github.com/multiformats/go-multiaddr/net"
)

// WriteReach prints where others reach a peer and whether they can. The
// advice on reaching it from other networks is left out for a peer that
// listens only on loopback, which is meant for this machine (a local
// pipeline's workers, a demo).
func WriteReach(w io.Writer, r Reach) {
	fmt.Fprintln(w, "reachable at:")
	for _, a := range r.Addrs {
		fmt.Fprintf(w, "  %s\n", a)
	}
	if r.LoopbackOnly() {
		fmt.Fprintln(w, "reachability: this machine only (loopback)")
		return
	}
	fmt.Fprintln(w, r)
}

// LoopbackOnly reports whether every address of r is a loopback one.
func (r Reach) LoopbackOnly() bool {
	if len(r.Addrs) == 0 || len(r.Relayed) > 0 {
		return false
	}
	for _, s := range r.Addrs {
		a, err := ma.NewMultiaddr(s)
		if err != nil || !manet.IsIPLoopback(a) {
			return false
		}
	}
	return true
}

// ReportReach prints h's peer ID, addresses and reachability now (to w,
// or as one JSON line to jsonOut if it is set) and, on w, whenever
// AutoNAT's verdict changes until ctx ends or h closes.
func ReportReach(ctx context.Context, h *Host, w, jsonOut io.Writer) {
	r := h.Reach()
	if jsonOut != nil {
		_ = json.NewEncoder(jsonOut).Encode(map[string]any{"peer": h.ID().String(), "addrs": r.Addrs, "reach": r})
	} else {
		fmt.Fprintf(w, "peer %s\n", h.ID())
		WriteReach(w, r)
	}
	if r.LoopbackOnly() {
		return // AutoNAT has nothing to say about loopback
	}
	go func() {
		_ = h.WatchReach(ctx, func(n Reach) {
			if n.Status != r.Status {
				r = n
				fmt.Fprintln(w, n)
			}
		})
	}()
}

// ShortID shortens a peer ID for display: its last 8 characters.
func ShortID(id string) string {
	if len(id) > 12 {
		return id[len(id)-8:]
	}
	return id
}
