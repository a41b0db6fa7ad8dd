package p2p

import (
	"errors"
	"fmt"

	"github.com/libp2p/go-libp2p/core/peer"
)

// ErrBusy reports a request refused because the requests this host reads
// or handles already fill Config.RequestMemory.
var ErrBusy = errors.New("busy")

// requestBytes counts the bytes of the requests a host reads or handles
// (Config.RequestMemory), in all and per peer. Host.mu guards it.
type requestBytes struct {
	total  int64
	byPeer map[peer.ID]int64
}

// reserveRequest counts n bytes of a request from p against
// Config.RequestMemory, or says why they do not fit; release gives them
// back.
func (h *Host) reserveRequest(p peer.ID, n int64) (release func(), err error) {
	limit := h.cfg.RequestMemory
	if limit <= 0 {
		return func() {}, nil
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	r := &h.reqs
	switch {
	case r.total+n > limit:
		return nil, fmt.Errorf("%w: the requests being read or handled hold %d MiB; %d MiB more would exceed this peer's %d MiB (try again, or another peer)", ErrBusy, r.total>>20, n>>20, limit>>20)
	case r.byPeer[p]+n > limit/4:
		return nil, fmt.Errorf("%w: your requests being read or handled hold %d MiB; %d MiB more would exceed your share, %d MiB (a quarter of this peer's request memory)", ErrBusy, r.byPeer[p]>>20, n>>20, limit/4>>20)
	}
	if r.byPeer == nil {
		r.byPeer = map[peer.ID]int64{}
	}
	r.total += n
	r.byPeer[p] += n
	return func() {
		h.mu.Lock()
		defer h.mu.Unlock()
		r.total -= n
		if r.byPeer[p] -= n; r.byPeer[p] <= 0 {
			delete(r.byPeer, p)
		}
	}, nil
}
