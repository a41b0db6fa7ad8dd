// Serving this peer's state to peers that join late (StateProtocol).

package optimizer

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/skyhive/skyhive/averaging"
	"github.com/skyhive/skyhive/tensor"
	"github.com/skyhive/skyhive/wire"
)

// stateServer serves snapshots of a peer's state, chunk by chunk, to
// joining peers, at most limit downloads at once. Its lock is taken before
// the Optimizer's (export takes that), never after.
type stateServer struct {
	layout Layout
	limit  int
	// export takes a snapshot of the state for a new download.
	export func() State

	mu      sync.Mutex
	serving map[peer.ID]*download
}

func newStateServer(l Layout, limit int, export func() State) *stateServer {
	return &stateServer{layout: l, limit: limit, export: export, serving: map[peer.ID]*download{}}
}

// download is a snapshot being served to one joiner.
type download struct {
	state State
	last  time.Time
}

// downloadIdle is how long a served snapshot is kept after its last request.
const downloadIdle = 10 * time.Second

// ErrBusy is returned (remotely) by a donor that serves as many downloads
// as it allows.
var ErrBusy = errors.New("averaging: donor busy")

// handle serves a chunk of this peer's state to a joining peer. The first
// request of a download (offset 0) takes a snapshot, at most limit at once.
func (sv *stateServer) handle(ctx context.Context, from peer.ID, req []byte) ([]byte, error) {
	r, err := unmarshalStateRequest(req)
	if err != nil {
		return nil, err
	}
	l := sv.layout
	if r.Count == 0 || r.Count > maxStateChunk || r.Offset > uint64(l.Total) {
		return nil, fmt.Errorf("%w: state range %d+%d of %d", averaging.ErrMessage, r.Offset, r.Count, l.Total)
	}
	end := min(uint64(l.Total), r.Offset+uint64(r.Count))
	d, err := sv.download(from, r.Offset == 0, end == uint64(l.Total))
	if err != nil {
		return nil, err
	}
	s := d.state
	payload, err := wire.Marshal(tensor.FromSlice(s.Vector[r.Offset:end], int(end-r.Offset)), wire.Options{})
	if err != nil {
		return nil, err
	}
	h := stateHeader{Layout: l.Hash, Total: uint64(l.Total), Round: uint64(s.Round), OptStep: uint64(s.OptStep), Epoch: uint64(s.Epoch)}
	return marshalStateResponse(h, payload), nil
}

// download returns the download of from, a new one if first, forgotten
// once last; downloads idle for downloadIdle are dropped.
func (sv *stateServer) download(from peer.ID, first, last bool) (*download, error) {
	now := time.Now()
	sv.mu.Lock()
	defer sv.mu.Unlock()
	for id, d := range sv.serving {
		if now.Sub(d.last) > downloadIdle {
			delete(sv.serving, id)
		}
	}
	d := sv.serving[from]
	if first {
		if d == nil && len(sv.serving) >= sv.limit {
			return nil, fmt.Errorf("%w: serving %d downloads", ErrBusy, len(sv.serving))
		}
		d = &download{state: sv.export()}
		sv.serving[from] = d
	}
	if d == nil {
		return nil, fmt.Errorf("%w: state download not started at offset 0", averaging.ErrMessage)
	}
	d.last = now
	if last {
		delete(sv.serving, from)
	}
	return d, nil
}
