package dht

import (
	"bytes"
	"container/heap"
	"errors"
	"fmt"
	"time"
)

// Item is a value with its expiration time, as returned by Get.
type Item struct {
	Value      []byte
	Expiration time.Time
}

// entry is one stored (key, subkey) value. An empty subkey marks a plain
// value; a key holds either one plain value or a dictionary of subkeys.
type entry struct {
	Key        string
	Subkey     string
	Value      []byte
	Expiration int64 // unix nanoseconds
	Signature  []byte

	// from is the peer that sent the entry ("" for this node's own
	// records and copies it fetched itself) and ip its network address
	// group ("" if unknown): what storage quotas are counted against.
	// Neither is on the wire. writer is the peer whose signature the
	// entry carries, "" if unsigned (see validateSignature).
	from, ip, writer string
}

// size is what an entry counts against byte quotas: its fields plus a
// fixed overhead for the bookkeeping around it.
func (e *entry) size() int {
	return len(e.Key) + len(e.Subkey) + len(e.Value) + len(e.Signature) + entryOverhead
}

const entryOverhead = 128

// Record validation and storage errors.
var (
	// ErrExpired means a record's expiration time has passed.
	ErrExpired = errors.New("dht: record expired")
	// ErrTooLarge means a key, subkey or value exceeds the size limits.
	ErrTooLarge = errors.New("dht: record too large")
	// ErrStale means a fresher record is already stored under the key.
	ErrStale = errors.New("dht: a fresher record is stored")
	// ErrDictionary means a plain value was refused because the key holds
	// a live dictionary of subkeys, which a plain value never replaces.
	ErrDictionary = errors.New("dht: a plain value cannot replace a dictionary")
	// ErrOwned means a subkey item was refused because another peer
	// wrote the live item under that subkey.
	ErrOwned = errors.New("dht: subkey written by another peer")
	// ErrQuota means the sending peer (or its address) has used up its
	// share of the node's storage, or the storage is full.
	ErrQuota = errors.New("dht: storage quota exceeded")
)

// newer reports whether a should replace b for the same (key, subkey): a
// later expiration wins; equal expirations are broken by value bytes so that
// all replicas converge to the same record whatever the arrival order.
func newer(a, b *entry) bool {
	if a.Expiration != b.Expiration {
		return a.Expiration > b.Expiration
	}
	return bytes.Compare(a.Value, b.Value) >= 0
}

// keyRecord is what one key holds: either a plain value (subkey "") or a
// dictionary of subkeys.
type keyRecord struct {
	items map[string]*entry
	// writers and ips count the key's items by writer (writerOf) and by
	// sending address group, for the per-key quotas.
	writers, ips map[string]int
}

// writerOf names who an item counts against under its key: the peer
// whose signature it carries, else the peer that sent it; "" for the
// node's own unsigned records, which count against nobody.
func writerOf(e *entry) string {
	if e.writer != "" {
		return "w:" + e.writer
	}
	if e.from != "" {
		return "p:" + e.from
	}
	return ""
}

func (r *keyRecord) plain() *entry { return r.items[""] }

func (r *keyRecord) maxExpiration() int64 {
	var m int64
	for _, e := range r.items {
		m = max(m, e.Expiration)
	}
	return m
}

// limits bounds a storage. Zero fields mean no bound.
type limits struct {
	items, bytes         int // whole storage
	peerItems, peerBytes int // per sending peer
	ipItems, ipBytes     int // per sending address group
	// keyWriterItems and keyIPItems bound the subkey items one writer, and
	// the peers behind one address group, may hold under one key, so
	// that nobody crowds a key that many peers declare under.
	keyWriterItems, keyIPItems int
}

// usage is what one peer or address group stores.
type usage struct {
	items, bytes int
	refs         map[itemRef]struct{} // per peer only: its items, for eviction
}

type itemRef struct{ key, subkey string }

// storage is a bounded map of records with expiration. It is a pure data
// structure: time is passed in, and it is not safe for concurrent use.
//
// The rules, which every replica applies the same way so that replicas and
// merged reads converge whatever the arrival order:
//   - per (key, subkey) the later expiration wins; in a sticky storage (a
//     node's, not a merge of answers) a live subkey item signed by its
//     writer is replaced only by the same writer, so that a declaration
//     can only be renewed by the peer that made it;
//   - a plain value never replaces a live dictionary (so nobody can erase a
//     key that many peers declare subkeys under), and a dictionary item
//     always replaces a plain value (plain values are last-writer-wins
//     anyway; an owner-marked key's subkeys need the same owner's signature);
//   - each sending peer and address group may hold at most its quota of
//     items and bytes;
//   - when full, room is made by evicting an item of the peer that holds
//     the most, never for that peer itself; the node's own records
//     (from "") count against no quota and are evicted, earliest expiration
//     first, only to make room for other own records.
type storage struct {
	lim    limits
	sticky bool
	keys   map[string]*keyRecord
	n      int // stored items
	bytes  int
	exp    expHeap
	peers  map[string]*usage
	ips    map[string]*usage
}

func newStorage(maxItems int) *storage {
	return newLimitedStorage(limits{items: maxItems})
}

// newMerger is a storage without limits nor sticky writers, for merging
// the answers of several replicas by expiration alone.
func newMerger() *storage {
	s := newLimitedStorage(limits{})
	s.sticky = false
	return s
}

func newLimitedStorage(lim limits) *storage {
	return &storage{lim: lim, sticky: true, keys: make(map[string]*keyRecord), peers: make(map[string]*usage), ips: make(map[string]*usage)}
}

// Len is the number of stored (key, subkey) items, expired ones included
// until the next cleanup.
func (s *storage) Len() int { return s.n }

// put stores e if it is not expired, is fresher than what the key holds
// and fits the quotas (see storage for the rules). put keeps e (no copy).
// If the storage is full and no room can be made, the items e would have
// replaced are dropped all the same: e was fresher than them.
func (s *storage) put(e *entry, now int64) error {
	if e.Expiration <= now {
		return ErrExpired
	}
	var gone []*entry // items of e.Key that storing e removes
	if rec := s.keys[e.Key]; rec != nil {
		if p := rec.plain(); p != nil {
			if e.Subkey == "" && !newer(e, p) {
				return ErrStale
			}
			gone = append(gone, p)
		} else if e.Subkey == "" {
			if rec.maxExpiration() > now {
				return ErrDictionary
			}
			for _, it := range rec.items {
				gone = append(gone, it)
			}
		} else if cur := rec.items[e.Subkey]; cur != nil {
			if s.sticky && cur.writer != "" && cur.writer != e.writer && cur.Expiration > now {
				return ErrOwned
			}
			if !newer(e, cur) {
				return ErrStale
			}
			gone = append(gone, cur)
		}
	}
	if err := s.checkQuota(e, gone); err != nil {
		return err
	}
	if err := s.checkKeyQuota(e, gone); err != nil {
		return err
	}
	for _, g := range gone {
		s.remove(g.Key, g.Subkey)
	}
	if err := s.makeRoom(e, now); err != nil {
		return err
	}
	rec := s.keys[e.Key]
	if rec == nil {
		rec = &keyRecord{items: make(map[string]*entry, 1), writers: map[string]int{}, ips: map[string]int{}}
		s.keys[e.Key] = rec
	}
	rec.items[e.Subkey] = e
	rec.count(e, 1)
	s.account(e, 1)
	heap.Push(&s.exp, expRef{exp: e.Expiration, key: e.Key, subkey: e.Subkey})
	s.compact()
	return nil
}

// checkQuota fails if storing e (and dropping gone) takes its peer or its
// address group over quota.
func (s *storage) checkQuota(e *entry, gone []*entry) error {
	over := func(u *usage, same func(*entry) bool, maxItems, maxBytes int) bool {
		items, size := 1, e.size()
		if u != nil {
			items += u.items
			size += u.bytes
		}
		for _, g := range gone {
			if same(g) {
				items--
				size -= g.size()
			}
		}
		return maxItems > 0 && items > maxItems || maxBytes > 0 && size > maxBytes
	}
	if e.from != "" && over(s.peers[e.from], func(g *entry) bool { return g.from == e.from }, s.lim.peerItems, s.lim.peerBytes) {
		return fmt.Errorf("%w: peer holds its %d items / %d bytes", ErrQuota, s.lim.peerItems, s.lim.peerBytes)
	}
	if e.ip != "" && over(s.ips[e.ip], func(g *entry) bool { return g.ip == e.ip }, s.lim.ipItems, s.lim.ipBytes) {
		return fmt.Errorf("%w: address %s holds its %d items / %d bytes", ErrQuota, e.ip, s.lim.ipItems, s.lim.ipBytes)
	}
	return nil
}

// checkKeyQuota fails if storing e (and dropping gone) takes its writer
// or its address group over their share of e's key.
func (s *storage) checkKeyQuota(e *entry, gone []*entry) error {
	rec := s.keys[e.Key]
	if rec == nil || e.from == "" {
		return nil
	}
	over := func(count map[string]int, id string, of func(*entry) string, limit int) bool {
		if limit <= 0 || id == "" {
			return false
		}
		n := count[id] + 1
		for _, g := range gone {
			if of(g) == id {
				n--
			}
		}
		return n > limit
	}
	if over(rec.writers, writerOf(e), writerOf, s.lim.keyWriterItems) {
		return fmt.Errorf("%w: the writer holds its %d items under key %q", ErrQuota, s.lim.keyWriterItems, e.Key)
	}
	if over(rec.ips, e.ip, func(g *entry) string { return g.ip }, s.lim.keyIPItems) {
		return fmt.Errorf("%w: address %s holds its %d items under key %q", ErrQuota, e.ip, s.lim.keyIPItems, e.Key)
	}
	return nil
}

// count adds (sign 1) or subtracts (sign -1) e from the key's counters.
func (r *keyRecord) count(e *entry, sign int) {
	if w := writerOf(e); w != "" {
		if r.writers[w] += sign; r.writers[w] <= 0 {
			delete(r.writers, w)
		}
	}
	if e.ip != "" {
		if r.ips[e.ip] += sign; r.ips[e.ip] <= 0 {
			delete(r.ips, e.ip)
		}
	}
}

func (s *storage) full(e *entry) bool {
	return s.lim.items > 0 && s.n+1 > s.lim.items || s.lim.bytes > 0 && s.bytes+e.size() > s.lim.bytes
}

// makeRoom evicts items until e fits, or fails.
func (s *storage) makeRoom(e *entry, now int64) error {
	if !s.full(e) {
		return nil
	}
	s.cleanup(now)
	for s.full(e) {
		if v := s.heaviest(); v != nil && (e.from == "" || v.items > s.usageItems(e.from)) {
			for r := range v.refs {
				s.remove(r.key, r.subkey)
				break
			}
			continue
		}
		if e.from != "" {
			return fmt.Errorf("%w: storage full (%d items, %d bytes)", ErrQuota, s.n, s.bytes)
		}
		// Only the node's own records are left: drop the one that expires
		// first, unless the new one would expire even earlier.
		top := s.earliest()
		if top == nil || top.Expiration > e.Expiration {
			return fmt.Errorf("%w: storage full (%d items, %d bytes)", ErrQuota, s.n, s.bytes)
		}
		s.remove(top.Key, top.Subkey)
	}
	return nil
}

// heaviest is the remote peer that stores the most items, or nil.
func (s *storage) heaviest() *usage {
	var best *usage
	for _, u := range s.peers {
		if best == nil || u.items > best.items {
			best = u
		}
	}
	return best
}

func (s *storage) usageItems(from string) int {
	if u := s.peers[from]; u != nil {
		return u.items
	}
	return 0
}

// account adds (sign 1) or subtracts (sign -1) e from the counters.
func (s *storage) account(e *entry, sign int) {
	size := e.size()
	s.n += sign
	s.bytes += sign * size
	ref := itemRef{e.Key, e.Subkey}
	if e.from != "" {
		u := s.peers[e.from]
		if u == nil {
			u = &usage{refs: make(map[itemRef]struct{})}
			s.peers[e.from] = u
		}
		u.items += sign
		u.bytes += sign * size
		if sign > 0 {
			u.refs[ref] = struct{}{}
		} else {
			delete(u.refs, ref)
		}
		if u.items == 0 {
			delete(s.peers, e.from)
		}
	}
	if e.ip != "" {
		u := s.ips[e.ip]
		if u == nil {
			u = &usage{}
			s.ips[e.ip] = u
		}
		u.items += sign
		u.bytes += sign * size
		if u.items == 0 {
			delete(s.ips, e.ip)
		}
	}
}

// get returns the unexpired items stored under key.
func (s *storage) get(key string, now int64) []*entry {
	rec := s.keys[key]
	if rec == nil {
		return nil
	}
	var out []*entry
	for _, e := range rec.items {
		if e.Expiration > now {
			out = append(out, e)
		}
	}
	return out
}

// all returns every unexpired item.
func (s *storage) all(now int64) []*entry {
	out := make([]*entry, 0, s.n)
	for _, rec := range s.keys {
		for _, e := range rec.items {
			if e.Expiration > now {
				out = append(out, e)
			}
		}
	}
	return out
}

// cleanup drops every item expired at now.
func (s *storage) cleanup(now int64) {
	for {
		top := s.earliest()
		if top == nil || top.Expiration > now {
			return
		}
		s.remove(top.Key, top.Subkey)
	}
}

// earliest returns the live item that expires first, discarding heap
// references to items that were replaced or removed.
func (s *storage) earliest() *entry {
	for s.exp.Len() > 0 {
		ref := s.exp[0]
		if rec := s.keys[ref.key]; rec != nil {
			if e := rec.items[ref.subkey]; e != nil && e.Expiration == ref.exp {
				return e
			}
		}
		heap.Pop(&s.exp)
	}
	return nil
}

func (s *storage) remove(key, subkey string) {
	rec := s.keys[key]
	if rec == nil {
		return
	}
	e := rec.items[subkey]
	if e == nil {
		return
	}
	delete(rec.items, subkey)
	rec.count(e, -1)
	s.account(e, -1)
	if len(rec.items) == 0 {
		delete(s.keys, key)
	}
}

func (s *storage) dropKey(key string) {
	if rec := s.keys[key]; rec != nil {
		for sk := range rec.items {
			s.remove(key, sk)
		}
	}
}

// compact rebuilds the expiration heap when stale references dominate it.
func (s *storage) compact() {
	if s.exp.Len() <= 2*s.n+1024 {
		return
	}
	s.exp = s.exp[:0]
	for k, rec := range s.keys {
		for sk, e := range rec.items {
			s.exp = append(s.exp, expRef{exp: e.Expiration, key: k, subkey: sk})
		}
	}
	heap.Init(&s.exp)
}

type expRef struct {
	exp         int64
	key, subkey string
}

type expHeap []expRef

func (h expHeap) Len() int           { return len(h) }
func (h expHeap) Less(i, j int) bool { return h[i].exp < h[j].exp }
func (h expHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *expHeap) Push(x any)        { *h = append(*h, x.(expRef)) }
func (h *expHeap) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}

// merge folds the answers of several replicas (one set each) into one
// item per subkey, with the storage's rules for plain values and
// dictionaries. When replicas disagree on who wrote a subkey, the writer
// that most replicas hold wins (ties go to the fresher item), so a replica
// that serves a forged-owner copy with a far expiration is outvoted; among
// one writer's items the fresher wins.
func merge(now int64, sets ...[]*entry) []*entry {
	type cand struct {
		e     *entry
		votes int
		set   int // the last set (1-based) that voted for it
	}
	cands := map[itemRef]*cand{}  // (subkey, writer) → best item
	bySub := map[string][]*cand{} // subkey → its writers' candidates
	for i, set := range sets {
		for _, e := range set {
			if e.Expiration <= now {
				continue
			}
			r := itemRef{e.Subkey, e.writer}
			c := cands[r]
			if c == nil {
				c = &cand{e: e}
				cands[r] = c
				bySub[e.Subkey] = append(bySub[e.Subkey], c)
			} else if newer(e, c.e) {
				c.e = e
			}
			if c.set != i+1 {
				c.set = i + 1
				c.votes++
			}
		}
	}
	best := func(ws []*cand) *cand {
		var b *cand
		for _, c := range ws {
			if b == nil || c.votes > b.votes || c.votes == b.votes && newer(c.e, b.e) {
				b = c
			}
		}
		return b
	}
	if bySub[""] == nil {
		// Subkey items alone: the storage's rules keep the best of each.
		out := make([]*entry, 0, len(bySub))
		for _, ws := range bySub {
			out = append(out, best(ws).e)
		}
		return out
	}
	m := newMerger()
	for _, ws := range bySub {
		best := best(ws)
		// In any order a plain value loses to a dictionary: it cannot
		// replace one, and a subkey item replaces it.
		_ = m.put(best.e, now)
	}
	return m.all(now)
}
