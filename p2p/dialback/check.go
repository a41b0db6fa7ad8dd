package dialback

import (
	"context"
	"fmt"
	"io"
	"slices"
	"text/tabwriter"

	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/skyhive/skyhive/p2p"
)

// Report is what a Check found (skyhive doctor).
type Report struct {
	Peer  string    `json:"peer"`
	Reach p2p.Reach `json:"reach"`
	// Seen holds what each peer that answered saw, by its ID.
	Seen map[string][]Result `json:"seen"`
	// Reachable reports whether some peer connected to some address.
	Reachable bool `json:"reachable"`
	// Verdict is what to do about it, in the words of the caller, who
	// knows how the host was configured; Check leaves it empty.
	Verdict string `json:"verdict"`
}

// Check asks up to n peers, the seeds first and then others (peers h
// knows the addresses of), to dial h back at each of its addresses, and
// says whether any got through. It fails if no peer answered.
func Check(ctx context.Context, h *p2p.Host, seeds []peer.AddrInfo, others []peer.ID, n int) (Report, error) {
	rep := Report{Peer: h.ID().String(), Reach: h.Reach(), Seen: map[string][]Result{}}
	asked := map[peer.ID]bool{}
	candidates := slices.Clone(seeds)
	for _, id := range others {
		candidates = append(candidates, h.LibP2P().Peerstore().PeerInfo(id))
	}
	var lastErr error
	for _, c := range candidates {
		if len(asked) == n || asked[c.ID] || c.ID == h.ID() {
			continue
		}
		asked[c.ID] = true
		res, err := Ask(ctx, h, c, rep.Reach.Addrs)
		if err != nil {
			lastErr = err
			continue
		}
		rep.Seen[c.ID.String()] = res
		for _, r := range res {
			rep.Reachable = rep.Reachable || r.OK
		}
	}
	if len(rep.Seen) == 0 {
		return rep, fmt.Errorf("no peer of the swarm answered the dial-back request (peers run skyhive dht, server or peer of this version): %w", lastErr)
	}
	return rep, nil
}

// WriteText prints the peer, its addresses and reachability, what each
// peer saw when it dialled each address, and the verdict.
func (rep Report) WriteText(w io.Writer) {
	fmt.Fprintf(w, "peer %s\n", rep.Peer)
	p2p.WriteReach(w, rep.Reach)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "DIALLED BY\tADDRESS\tRESULT")
	for by, rs := range rep.Seen {
		for _, r := range rs {
			res := fmt.Sprintf("connected in %.1f ms", r.Millis)
			if !r.OK {
				res = r.Error
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\n", p2p.ShortID(by), r.Addr, res)
		}
	}
	tw.Flush()
	fmt.Fprintln(w, rep.Verdict)
}
