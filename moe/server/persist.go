// What a server keeps outside its process: its declarations in the DHT and
// its checkpoints.

package server

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/skyhive/skyhive/checkpoint"
	"github.com/skyhive/skyhive/dht"
	"github.com/skyhive/skyhive/moe"
	"github.com/skyhive/skyhive/nn"
	"github.com/skyhive/skyhive/optim"
	"github.com/skyhive/skyhive/tensor"
)

// Declare stores the experts' DHT records once, with expiration now +
// Expiration, and returns the number of records that no replica accepted.
// Those that replicas refused (dht.ErrRejected: e.g. another peer holds the
// subkey) are also counted in Stats.DeclareRefused; a shared prefix held by
// another server is not a failure.
func (s *Server) Declare(ctx context.Context) (int, error) {
	if s.cfg.DHT == nil {
		return 0, errors.New("moe/server: no DHT configured")
	}
	// One round at a time, with increasing expirations, so that a later
	// round's records are always the fresher ones.
	s.declRound.Lock()
	defer s.declRound.Unlock()
	self := s.cfg.Transport.AddrInfo()
	exp := time.Now().Add(s.cfg.Expiration)
	if !exp.After(s.lastExp) {
		exp = s.lastExp.Add(time.Millisecond)
	}
	s.lastExp = exp
	type item struct {
		rec    moe.Record
		info   []byte
		shared bool // a prefix other servers may declare too
	}
	var items []item
	seen := map[moe.Record]bool{}
	for _, uid := range s.order {
		recs, err := moe.Records(uid)
		if err != nil {
			return 0, err
		}
		info, err := moe.MarshalInfo(moe.ExpertInfo{UID: uid, Peer: self, Type: s.cfg.Type, Hidden: s.cfg.Hidden})
		if err != nil {
			return 0, err
		}
		for i, r := range recs {
			if (r.Subkey == "" && s.cfg.NoUIDRecords) || seen[r] {
				continue
			}
			seen[r] = true
			items = append(items, item{r, info, i > 0 && i < len(recs)-1})
		}
	}
	var (
		mu      sync.Mutex
		fails   int
		refused int
		first   error
		wg      sync.WaitGroup
	)
	sem := make(chan struct{}, s.cfg.DeclareParallel)
	for _, it := range items {
		select {
		case sem <- struct{}{}:
		case <-ctx.Done():
			wg.Wait()
			return fails, ctx.Err()
		}
		wg.Go(func() {
			defer func() { <-sem }()
			_, err := s.cfg.DHT.Store(ctx, it.rec.Key, it.rec.Subkey, it.info, exp)
			if it.shared && errors.Is(err, dht.ErrRejected) {
				// Another server holding an expert under the same
				// prefix declared it with a later expiration.
				err = nil
			}
			if err != nil {
				mu.Lock()
				fails++
				if errors.Is(err, dht.ErrRejected) {
					refused++
				}
				if first == nil {
					first = fmt.Errorf("declare %s/%s: %w", it.rec.Key, it.rec.Subkey, err)
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	s.declMu.Lock()
	s.declared = time.Now()
	s.declareFails += fails
	s.declareRefused += refused
	s.lastRefused = refused
	s.declMu.Unlock()
	if fails == len(items) && first != nil {
		return fails, first
	}
	return fails, nil
}

// declareLoop declares the experts every DeclareEvery. After a round in
// which some records were not stored it retries sooner: after 1 s, then
// doubling up to DeclareEvery, so that a server that started before its
// DHT peers were reachable is found within seconds.
func (s *Server) declareLoop(ctx context.Context) {
	retry := time.Second
	for {
		dctx, cancel := context.WithTimeout(ctx, s.cfg.DeclareEvery)
		n, err := s.Declare(dctx)
		cancel()
		wait := s.cfg.DeclareEvery
		if err != nil || n > 0 {
			s.declMu.Lock()
			refused := s.lastRefused
			s.declMu.Unlock()
			s.cfg.Logger.Warn("declare experts", "failed", n, "refused", refused, "err", err, "retry_in", min(wait, retry))
			wait = min(wait, retry)
			retry = min(2*retry, s.cfg.DeclareEvery)
		} else {
			retry = time.Second
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
	}
}

func (s *Server) checkpointLoop(ctx context.Context) {
	t := time.NewTicker(s.cfg.CheckpointEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			if err := s.Save(s.cfg.CheckpointPath); err != nil {
				s.cfg.Logger.Error("checkpoint", "err", err)
			}
		}
	}
}

// Save writes every materialized expert's weights and optimizer state to
// path atomically. Tensors are named "UID/PARAM" and "UID/opt/BUFFER"; the
// metadata records each expert's optimizer step as "UID/step".
//
// The file being replaced is kept as path + PrevSuffix, so one earlier
// generation survives a bad save. An expert whose weights or optimizer
// state are not finite is never written: the state it had in the file
// being replaced (its last good state) is carried over into the new file
// and restored in memory, or, if the file has none, the expert starts
// afresh from its initial weights and is left out of the file. Such a
// rollback is logged and counted in ExpertStats.Rollbacks.
func (s *Server) Save(path string) error {
	s.saveMu.Lock()
	defer s.saveMu.Unlock()
	tensors := map[string]*tensor.Tensor{}
	meta := map[string]string{"format": "skyhive-moe-experts/1", "type": s.cfg.Type, "hidden": strconv.Itoa(s.cfg.Hidden)}
	var prev *checkpoint.File // the file being replaced, read only if needed
	var prevErr error
	for _, uid := range s.order {
		e := s.experts[uid]
		e.mu.Lock()
		params, st, ok, err := e.weights()
		if err != nil {
			e.mu.Unlock()
			return fmt.Errorf("moe/server: checkpoint not written: %w", err)
		}
		if !ok {
			e.mu.Unlock()
			continue
		}
		if !tensorsFinite(params) || !tensorsFinite(st.Tensors) {
			if prev == nil && prevErr == nil {
				prev, prevErr = checkpoint.Load(path)
			}
			var ok bool
			params, st, ok = s.restore(e, prev)
			e.mu.Unlock()
			e.statsMu.Lock()
			e.stats.Rollbacks++
			e.statsMu.Unlock()
			s.cfg.Logger.Error("checkpoint: expert weights not finite; not saved, last good state restored",
				"expert", uid, "from_checkpoint", ok, "prev_err", prevErr)
			if !ok {
				continue
			}
		} else {
			e.mu.Unlock()
		}
		for name, t := range params {
			tensors[uid+"/"+name] = t
		}
		for name, t := range st.Tensors {
			tensors[uid+"/opt/"+name] = t
		}
		meta[uid+"/step"] = strconv.FormatInt(st.Step, 10)
	}
	if dir := filepath.Dir(path); dir != "" {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return fmt.Errorf("moe/server: checkpoint: %w", err)
		}
	}
	if err := keepPrevious(path); err != nil {
		return fmt.Errorf("moe/server: checkpoint: keep previous generation: %w", err)
	}
	if err := checkpoint.Save(path, tensors, meta); err != nil {
		return fmt.Errorf("moe/server: checkpoint: %w", err)
	}
	return nil
}

// PrevSuffix names the previous checkpoint generation: Save keeps the file
// it replaces as path + PrevSuffix, and New loads it if path is damaged.
const PrevSuffix = ".prev"

// keepPrevious makes path + PrevSuffix a copy of path (a hard link when
// the file system allows it), replacing the older one atomically. A
// missing path is no error.
func keepPrevious(path string) error {
	prev := path + PrevSuffix
	tmp := prev + ".tmp"
	if err := os.Remove(tmp); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	if err := os.Link(path, tmp); err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil
		}
		// No hard links here: copy instead.
		if err := checkpoint.WriteAtomic(tmp, func(w io.Writer) error {
			f, err := os.Open(path)
			if err != nil {
				return err
			}
			defer f.Close()
			_, err = io.Copy(w, f)
			return err
		}); err != nil {
			return err
		}
	}
	return os.Rename(tmp, prev)
}

// restore puts e back to its last good state: the one in f (the checkpoint
// being replaced) if f holds a finite one, else its initial weights and a
// fresh optimizer. It returns the restored weights and optimizer state and
// whether they came from f (only then are they worth saving). The caller
// holds e.mu.
func (s *Server) restore(e *expert, f *checkpoint.File) (map[string]*tensor.Tensor, optim.State, bool) {
	e.pendingRows, e.pendingBatches = 0, 0
	if f != nil {
		if err := s.loadExpert(e, f); err == nil {
			if params, st, ok, err := e.weights(); err == nil && ok {
				return params, st, true
			}
		}
	}
	if err := e.reset(); err != nil {
		s.cfg.Logger.Error("expert not restored", "expert", e.uid, "err", err)
	}
	return nil, optim.State{}, false
}

// load restores the experts found in the checkpoint at path, if it exists.
// If the file is damaged, the previous generation (path + PrevSuffix) is
// loaded instead. An expert whose saved state is missing from the file or
// not finite starts from its initial weights (or its state in the previous
// generation, if that one is good).
func (s *Server) load(path string) error {
	f, err := checkpoint.Load(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	var prev *checkpoint.File
	if err != nil {
		var perr error
		prev, perr = checkpoint.Load(path + PrevSuffix)
		if perr != nil {
			return fmt.Errorf("moe/server: load checkpoint: %w", err)
		}
		s.cfg.Logger.Error("checkpoint damaged; loading the previous generation", "path", path, "err", err)
		f, prev = prev, nil
	}
	if f.Meta["type"] != s.cfg.Type || f.Meta["hidden"] != strconv.Itoa(s.cfg.Hidden) {
		return fmt.Errorf("moe/server: checkpoint %s holds %s experts of hidden %s, not %s/%d", path, f.Meta["type"], f.Meta["hidden"], s.cfg.Type, s.cfg.Hidden)
	}
	for _, uid := range s.order {
		if _, ok := f.Meta[uid+"/step"]; !ok {
			continue
		}
		e := s.experts[uid]
		e.mu.Lock()
		err := s.loadExpert(e, f)
		if errors.Is(err, errNotFinite) {
			if prev == nil {
				prev, _ = checkpoint.Load(path + PrevSuffix)
			}
			_, _, ok := s.restore(e, prev)
			s.cfg.Logger.Error("checkpoint: expert weights not finite; not loaded", "expert", uid, "from_previous", ok)
			err = nil
		}
		e.mu.Unlock()
		if err != nil {
			return err
		}
	}
	return nil
}

// errNotFinite marks an expert whose saved state holds NaN or infinity.
var errNotFinite = errors.New("saved state not finite")

// loadExpert imports e's weights and optimizer state from f; on error e is
// left unchanged, and a saved state that is not finite is an error
// (errNotFinite). The caller holds e.mu.
func (s *Server) loadExpert(e *expert, f *checkpoint.File) error {
	uid := e.uid
	stepStr, ok := f.Meta[uid+"/step"]
	if !ok {
		return fmt.Errorf("moe/server: checkpoint lacks %s", uid)
	}
	step, err := strconv.ParseInt(stepStr, 10, 64)
	if err != nil {
		return fmt.Errorf("moe/server: checkpoint step of %s: %w", uid, err)
	}
	if e.cfg.Executor != nil {
		params := map[string]*tensor.Tensor{}
		st := optim.State{Step: step, Tensors: map[string]*tensor.Tensor{}}
		for name, t := range f.Tensors {
			if rest, ok := strings.CutPrefix(name, uid+"/"); ok {
				if o, ok := strings.CutPrefix(rest, "opt/"); ok {
					st.Tensors[o] = t
				} else {
					params[rest] = t
				}
			}
		}
		if !tensorsFinite(params) || !tensorsFinite(st.Tensors) {
			return fmt.Errorf("moe/server: checkpoint of %s: %w", uid, errNotFinite)
		}
		return e.loadExecutor(params, st)
	}
	e.materialize()
	params := map[string]*tensor.Tensor{}
	st := optim.State{Step: step, Tensors: map[string]*tensor.Tensor{}}
	for _, p := range e.module.Params() {
		params[p.Name] = f.Tensors[uid+"/"+p.Name]
	}
	for name := range e.opt.State().Tensors {
		st.Tensors[name] = f.Tensors[uid+"/opt/"+name]
	}
	for name, t := range params {
		if t == nil {
			return fmt.Errorf("moe/server: checkpoint lacks %s/%s", uid, name)
		}
	}
	for name, t := range st.Tensors {
		if t == nil {
			return fmt.Errorf("moe/server: checkpoint lacks optimizer state %s/%s", uid, name)
		}
	}
	if !tensorsFinite(params) || !tensorsFinite(st.Tensors) {
		return fmt.Errorf("moe/server: checkpoint of %s: %w", uid, errNotFinite)
	}
	old := nn.ExportParams(e.module.Params())
	if err := nn.ImportParams(e.module.Params(), params); err != nil {
		return fmt.Errorf("moe/server: checkpoint of %s: %w", uid, err)
	}
	if err := e.opt.LoadState(st); err != nil {
		_ = nn.ImportParams(e.module.Params(), old) // same names and shapes
		return fmt.Errorf("moe/server: checkpoint of %s: %w", uid, err)
	}
	return nil
}
