// Downloading a donor's state: from several donors at once, cross-checked.

package optimizer

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"math"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/skyhive/skyhive/averaging"
	"github.com/skyhive/skyhive/clock"
	"github.com/skyhive/skyhive/p2p"
	"github.com/skyhive/skyhive/tensor"
	"github.com/skyhive/skyhive/wire"
)

// maxStateChunk is the most elements a state request asks for (4 MiB).
const maxStateChunk = 1 << 20

// stateCallTimeout bounds one chunk's request and answer (4 MiB in 30 s:
// a donor slower than 140 kB/s is given up on).
const stateCallTimeout = 30 * time.Second

// FetchState downloads one donor's state, chunk by chunk; busy donors are
// retried a few times.
func FetchState(ctx context.Context, t p2p.Transport, from peer.AddrInfo, l Layout) (State, error) {
	if l.Total <= 0 || l.Total > averaging.DefaultMaxElements {
		return State{}, fmt.Errorf("averaging: state of %d elements", l.Total)
	}
	out := make([]float32, 0, l.Total)
	var h stateHeader
	for len(out) < l.Total {
		n := min(l.Total-len(out), maxStateChunk)
		req := stateRequest{Offset: uint64(len(out)), Count: uint32(n)}.marshal()
		var resp []byte
		var err error
		for try := 0; ; try++ {
			// Every chunk has its own deadline, so a donor that trickles
			// its answer is given up on.
			cctx, cancel := context.WithTimeout(ctx, stateCallTimeout)
			resp, err = t.Call(cctx, from, StateProtocol, req)
			cancel()
			var re *p2p.RemoteError
			if err == nil || try == 4 || !errors.As(err, &re) || !strings.Contains(re.Msg, ErrBusy.Error()) {
				break
			}
			if serr := clock.Sleep(ctx, time.Duration(200<<try)*time.Millisecond); serr != nil {
				break
			}
		}
		if err != nil {
			return State{}, fmt.Errorf("fetch state from %s: %w", from.ID.ShortString(), err)
		}
		hh, payload, err := unmarshalStateResponse(resp)
		if err != nil {
			return State{}, err
		}
		switch {
		case hh.Layout != l.Hash || hh.Total != uint64(l.Total):
			return State{}, fmt.Errorf("%w: %s has another model or optimizer (%d state elements, want %d)", averaging.ErrMessage, from.ID.ShortString(), hh.Total, l.Total)
		case len(out) > 0 && hh != h:
			return State{}, fmt.Errorf("%w: %s changed its snapshot during the download", averaging.ErrMessage, from.ID.ShortString())
		}
		h = hh
		x, err := wire.Unmarshal(payload, wire.Limits{MaxElements: n, MaxDims: 1})
		if err != nil {
			return State{}, fmt.Errorf("averaging: state from %s: %w", from.ID.ShortString(), err)
		}
		if x.Len() != n {
			return State{}, fmt.Errorf("%w: state chunk of %d elements, want %d", averaging.ErrMessage, x.Len(), n)
		}
		for _, v := range x.Data {
			if math.IsNaN(float64(v)) || math.IsInf(float64(v), 0) {
				return State{}, fmt.Errorf("%w: non-finite value in the state from %s", averaging.ErrMessage, from.ID.ShortString())
			}
		}
		out = append(out, x.Data...)
	}
	return State{Vector: out, Round: int(h.Round), OptStep: int(h.OptStep), Epoch: int(h.Epoch)}, nil
}

// DownloadConfig tunes Download.
type DownloadConfig struct {
	// Donors is how many donors' states are downloaded and cross-checked
	// (2); the result is their mean.
	Donors int
	// MaxDivergence is the largest relative distance ‖a−b‖/min(‖a‖,‖b‖)
	// between two donors' models that counts as agreement (1), for the
	// whole model and for every parameter tensor (see agreeStates).
	// Replicas of one run stay far closer; a donor serving garbage does not.
	MaxDivergence float64
	// MinAgree is how many donors must serve agreeing states (1: a lone
	// donor that answers is used, and Downloaded.Unverified says so). Open
	// swarms should set 2, so that no single donor decides the state.
	MinAgree int
}

// Downloaded is the outcome of Download.
type Downloaded struct {
	State State
	// From lists the donors whose states were averaged.
	From []peer.ID
	// Rejected lists donors whose state disagreed with the others.
	Rejected []peer.ID
	// Failed lists donors that did not answer or answered badly, with why.
	Failed map[peer.ID]error
	// Unverified is set when the state comes from one donor only, so
	// nothing was cross-checked.
	Unverified bool
	// BuffersReset is set when the donors' models agreed but no two of
	// their optimizer buffers did (e.g. one donor had not stepped yet):
	// the joiner then starts with zero buffers (momentum), which costs a
	// few steps of warm-up and cannot carry a poisoned buffer.
	BuffersReset bool
}

// Download fetches the state from several of the candidate donors (in
// order of preference) at once, cross-checks their models, and returns the
// mean of those that agree. With one donor answering it uses that one; with
// none it returns an error naming every donor tried and why.
func Download(ctx context.Context, t p2p.Transport, candidates []peer.AddrInfo, l Layout, cfg DownloadConfig) (Downloaded, error) {
	if cfg.Donors <= 0 {
		cfg.Donors = 2
	}
	if cfg.MaxDivergence <= 0 {
		cfg.MaxDivergence = 1
	}
	cfg.MinAgree = max(cfg.MinAgree, 1)
	cfg.Donors = max(cfg.Donors, cfg.MinAgree)
	res := Downloaded{Failed: map[peer.ID]error{}}
	var got []State
	var from []peer.ID
	next := 0
	// The choice among the states fetched so far (choose compares whole
	// models pairwise), and for how many states it was made.
	var keep []int
	var reset bool
	chosen := -1
	// Fetch from up to Donors candidates at once until Donors states agree
	// or the candidates run out.
	for next < len(candidates) && ctx.Err() == nil {
		want := cfg.Donors - len(got)
		if len(got) >= cfg.Donors {
			keep, reset = choose(got, l, cfg)
			chosen = len(got)
			if len(keep) >= cfg.MinAgree && !reset {
				break
			}
			want = 1 // disagreement: one more donor breaks the tie
		}
		batch := candidates[next:min(len(candidates), next+want)]
		next += len(batch)
		states := make([]State, len(batch))
		errs := make([]error, len(batch))
		var wg sync.WaitGroup
		for i, c := range batch {
			wg.Go(func() { states[i], errs[i] = FetchState(ctx, t, c, l) })
		}
		wg.Wait()
		for i, c := range batch {
			if errs[i] != nil {
				res.Failed[c.ID] = errs[i]
				continue
			}
			got = append(got, states[i])
			from = append(from, c.ID)
		}
	}
	if len(got) == 0 {
		if len(candidates) == 0 {
			return res, errors.New("averaging: no donors to download the state from")
		}
		var errs []error
		for _, c := range candidates {
			if err, ok := res.Failed[c.ID]; ok {
				errs = append(errs, err)
			}
		}
		if ctx.Err() != nil {
			errs = append(errs, ctx.Err())
		}
		return res, fmt.Errorf("averaging: no donor answered (%d tried): %w", len(res.Failed), errors.Join(errs...))
	}
	if chosen != len(got) {
		keep, reset = choose(got, l, cfg)
	}
	if keep == nil {
		return res, fmt.Errorf("averaging: the states of donors %v disagree (relative distance above %.2g)", shortIDs(from), cfg.MaxDivergence)
	}
	if len(keep) < cfg.MinAgree {
		return res, fmt.Errorf("averaging: %d donors agree (%v), %d required%s", len(keep), shortIDs(from), cfg.MinAgree, failedNote(res.Failed))
	}
	res.BuffersReset = reset
	// The counters are the lowest of the agreeing donors': a donor cannot
	// push the joiner's round, step or epoch ahead of the others'.
	mean := State{Vector: make([]float32, l.Total), Round: math.MaxInt, OptStep: math.MaxInt, Epoch: math.MaxInt}
	for i, s := range got {
		if !slices.Contains(keep, i) {
			res.Rejected = append(res.Rejected, from[i])
			continue
		}
		tensor.Axpy(1/float32(len(keep)), s.Vector, mean.Vector)
		mean.Round = min(mean.Round, s.Round)
		mean.OptStep = min(mean.OptStep, s.OptStep)
		mean.Epoch = min(mean.Epoch, s.Epoch)
		res.From = append(res.From, from[i])
	}
	if res.BuffersReset {
		clear(mean.Vector[l.Params:])
	}
	res.State = mean
	res.Unverified = len(keep) == 1
	return res, nil
}

// choose picks the donors' states to average: those whose models agree
// (agree) and, of them, those whose optimizer buffers agree too, if at
// least two (and MinAgree) do; otherwise all whose models agree, with
// reset set: their buffers are not to be used.
func choose(got []State, l Layout, cfg DownloadConfig) (keep []int, reset bool) {
	keep = agree(got, l, cfg.MaxDivergence)
	if len(keep) < 2 {
		return keep, false
	}
	if b := agreeBuffers(got, keep, l); len(b) >= max(2, cfg.MinAgree) {
		return b, false
	}
	return keep, true
}

// agreeBuffers returns the largest subset of the states at indices keep
// (the first such) whose optimizer buffers pairwise agree (buffersAgree).
func agreeBuffers(states []State, keep []int, l Layout) []int {
	return largestAgreeing(keep, func(i, j int) bool { return buffersAgree(states[i], states[j], l) })
}

// buffersAgree says whether two donors' optimizer buffers agree. Buffers
// (momentum) are each peer's own and differ between honest donors far
// more than their averaged models do, tensor by tensor (a donor that
// joined recently has little momentum): only their overall sizes are
// compared, at most maxBufferRatio apart (or both negligible against the
// model), which catches a scaled-up buffer.
func buffersAgree(a, b State, l Layout) bool {
	model := min(averaging.Norm(a.Model(l)), averaging.Norm(b.Model(l)))
	nba, nbb := averaging.Norm(a.Vector[l.Params:]), averaging.Norm(b.Vector[l.Params:])
	small, big := min(nba, nbb), max(nba, nbb)
	return big == 0 || big <= maxBufferRatio*small || big <= 1e-3*model
}

// agree returns the indices of the largest set of states that pairwise
// agree (agreeStates) (the first such set), or nil if no two agree while
// there are several.
func agree(states []State, l Layout, maxDiv float64) []int {
	if len(states) == 1 {
		return []int{0}
	}
	all := make([]int, len(states))
	for i := range all {
		all[i] = i
	}
	best := largestAgreeing(all, func(i, j int) bool { return agreeStates(states[i], states[j], l, maxDiv) })
	if len(best) < 2 {
		return nil
	}
	return best
}

// largestAgreeing greedily grows, from each index of idx, a set whose
// members pairwise satisfy ok, and returns the largest (the first such),
// sorted.
func largestAgreeing(idx []int, ok func(i, j int) bool) []int {
	var best []int
	for _, i := range idx {
		set := []int{i}
		for _, j := range idx {
			if j != i && !slices.ContainsFunc(set, func(k int) bool { return !ok(k, j) }) {
				set = append(set, j)
			}
		}
		if len(set) > len(best) {
			best = set
		}
	}
	slices.Sort(best)
	return best
}

// agreeStates says whether two donors' states agree. The whole model must
// be within relative distance maxDiv, and so must every parameter tensor,
// measured against the larger of the smaller norm and the tensor's share
// of the model's norm (‖model‖·√(size/params)): a donor cannot hide a
// poisoned bias in a large model, while small tensors near zero do not
// count as disagreeing. Optimizer buffers are compared separately
// (buffersAgree). What is not checked: changes within these bounds.
func agreeStates(a, b State, l Layout, maxDiv float64) bool {
	ma, mb := a.Model(l), b.Model(l)
	if relDistance(ma, mb) > maxDiv {
		return false
	}
	within := func(x, y []float32, whole float64, total int, limit float64) bool {
		var d, nx, ny float64
		for i := range x {
			p, q := float64(x[i]), float64(y[i])
			d += (p - q) * (p - q)
			nx += p * p
			ny += q * q
		}
		scale := max(math.Sqrt(min(nx, ny)), whole*math.Sqrt(float64(len(x))/float64(max(total, 1))))
		return math.Sqrt(d) <= limit*scale
	}
	model := min(averaging.Norm(ma), averaging.Norm(mb))
	off := 0
	for _, n := range l.ParamSizes {
		if !within(ma[off:off+n], mb[off:off+n], model, l.Params, maxDiv) {
			return false
		}
		off += n
	}
	return true
}

// maxBufferRatio bounds the ratio of two donors' optimizer-buffer norms.
const maxBufferRatio = 10

// relDistance is ‖a−b‖/min(‖a‖,‖b‖) (0 for two zero vectors, +Inf when
// only one is zero), so a donor that scales the model up is far too.
func relDistance(a, b []float32) float64 {
	var d, na, nb float64
	for i := range a {
		x, y := float64(a[i]), float64(b[i])
		d += (x - y) * (x - y)
		na += x * x
		nb += y * y
	}
	if d == 0 {
		return 0
	}
	return math.Sqrt(d / min(na, nb))
}

// failedNote lists the donors that did not answer, and why, for an error.
func failedNote(failed map[peer.ID]error) string {
	if len(failed) == 0 {
		return ""
	}
	var b strings.Builder
	fmt.Fprintf(&b, "; %d of the candidates failed:", len(failed))
	for _, id := range slices.Sorted(maps.Keys(failed)) {
		fmt.Fprintf(&b, " %s: %v;", shortIDs([]peer.ID{id})[0], failed[id])
	}
	return strings.TrimSuffix(b.String(), ";")
}

func shortIDs(ids []peer.ID) []string {
	s := make([]string, len(ids))
	for i, id := range ids {
		s[i] = id.ShortString()
	}
	return s
}
