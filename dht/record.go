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
}

// Record validation errors.
var (
	// ErrExpired means a record's expiration time has passed.
	ErrExpired = errors.New("dht: record expired")
	// ErrTooLarge means a key, subkey or value exceeds the size limits.
	ErrTooLarge = errors.New("dht: record too large")
	// ErrStale means a fresher record is already stored under the key.
	ErrStale = errors.New("dht: a fresher record is stored")
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
}

func (r *keyRecord) plain() *entry { return r.items[""] }

func (r *keyRecord) maxExpiration() int64 {
	var m int64
	for _, e := range r.items {
		m = max(m, e.Expiration)
	}
	return m
}

// storage is a bounded map of records with expiration. It is a pure data
// structure: time is passed in, and it is not safe for concurrent use.
type storage struct {
	maxItems int
	keys     map[string]*keyRecord
	n        int // stored items
	exp      expHeap
}

func newStorage(maxItems int) *storage {
	return &storage{maxItems: maxItems, keys: make(map[string]*keyRecord)}
}

// Len is the number of stored (key, subkey) items, expired ones included
// until the next cleanup.
func (s *storage) Len() int { return s.n }

// put stores e if it is not expired and is fresher than what the key holds,
// following the rules: per subkey the later expiration wins; a plain value
// replaces a dictionary only if it outlives every subkey, and a subkey
// replaces a plain value only if it outlives it. put keeps e (no copy).
func (s *storage) put(e *entry, now int64) error {
	if e.Expiration <= now {
		return ErrExpired
	}
	rec := s.keys[e.Key]
	if rec != nil {
		if p := rec.plain(); p != nil {
			if e.Subkey == "" && !newer(e, p) || e.Subkey != "" && e.Expiration <= p.Expiration {
				return ErrStale
			}
			if e.Subkey != "" {
				s.dropKey(e.Key)
				rec = nil
			}
		} else if e.Subkey == "" {
			if e.Expiration <= rec.maxExpiration() {
				return ErrStale
			}
			s.dropKey(e.Key)
			rec = nil
		} else if cur := rec.items[e.Subkey]; cur != nil && !newer(e, cur) {
			return ErrStale
		}
	}
	replacing := rec != nil && rec.items[e.Subkey] != nil
	if !replacing && s.maxItems > 0 && s.n >= s.maxItems {
		s.cleanup(now)
		if s.n >= s.maxItems {
			// Full: make room by dropping the item that expires first,
			// unless the new one would expire even earlier.
			top := s.earliest()
			if top == nil || top.Expiration > e.Expiration {
				return fmt.Errorf("dht: storage full (%d items)", s.maxItems)
			}
			s.remove(top.Key, top.Subkey)
			rec = s.keys[e.Key]
		}
	}
	if rec == nil {
		rec = &keyRecord{items: make(map[string]*entry, 1)}
		s.keys[e.Key] = rec
	}
	if !replacing {
		s.n++
	}
	rec.items[e.Subkey] = e
	heap.Push(&s.exp, expRef{exp: e.Expiration, key: e.Key, subkey: e.Subkey})
	s.compact()
	return nil
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
	if rec == nil || rec.items[subkey] == nil {
		return
	}
	delete(rec.items, subkey)
	s.n--
	if len(rec.items) == 0 {
		delete(s.keys, key)
	}
}

func (s *storage) dropKey(key string) {
	if rec := s.keys[key]; rec != nil {
		s.n -= len(rec.items)
		delete(s.keys, key)
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

// merge folds items from several replicas into the freshest per subkey,
// with the same rules as storage.
func merge(now int64, sets ...[]*entry) []*entry {
	m := newStorage(0)
	for _, set := range sets {
		for _, e := range set {
			_ = m.put(e, now) // stale or expired items are simply dropped
		}
	}
	return m.all(now)
}
