package dht

import (
	"errors"
	"fmt"
	"maps"
	"testing"
)

func entFrom(key, sub, from, ip string, size int, exp int64) *entry {
	return &entry{Key: key, Subkey: sub, Value: make([]byte, size), Expiration: exp, from: from, ip: ip}
}

// TestStoragePeerQuota floods a storage from one peer: it keeps at most
// its quota of items and bytes, and other peers still store.
func TestStoragePeerQuota(t *testing.T) {
	s := newLimitedStorage(limits{items: 1000, peerItems: 100, peerBytes: 100 * (entryOverhead + 64)})
	for i := range 10_000 {
		_ = s.put(entFrom(fmt.Sprint("k", i), "", "evil", "", 10, 1<<40), 0)
	}
	if u := s.peers["evil"]; u == nil || u.items != 100 || s.Len() != 100 {
		t.Fatalf("flood kept %d items", s.Len())
	}
	// Big values hit the byte quota first.
	for i := range 100 {
		_ = s.put(entFrom(fmt.Sprint("big", i), "", "fat", "", 4096, 1<<40), 0)
	}
	if u := s.peers["fat"]; u == nil || u.bytes > s.lim.peerBytes || u.items > 4 {
		t.Fatalf("byte quota: %+v", u)
	}
	if err := s.put(entFrom("honest", "", "good", "", 10, 100), 0); err != nil {
		t.Fatalf("honest peer refused: %v", err)
	}
	// Replacing one's own item does not count twice.
	if err := s.put(entFrom("k0", "", "evil", "", 10, 1<<41), 0); err != nil {
		t.Fatalf("replacing own item under quota: %v", err)
	}
	if err := s.put(entFrom("new", "", "evil", "", 10, 1<<41), 0); !errors.Is(err, ErrQuota) {
		t.Fatalf("over quota: %v", err)
	}
}

// TestStorageAddrQuota floods from many identities behind one address.
func TestStorageAddrQuota(t *testing.T) {
	s := newLimitedStorage(limits{items: 1000, peerItems: 50, ipItems: 200})
	for id := range 100 {
		for i := range 50 {
			_ = s.put(entFrom(fmt.Sprint("k", id, ".", i), "", fmt.Sprint("sybil", id), "203.0.113.7", 10, 1<<40), 0)
		}
	}
	if s.Len() != 200 || s.ips["203.0.113.7"].items != 200 {
		t.Fatalf("one address stores %d items", s.Len())
	}
	if err := s.put(entFrom("honest", "", "good", "198.51.100.1", 10, 100), 0); err != nil {
		t.Fatalf("honest peer refused: %v", err)
	}
}

// TestStorageFullEvictsHeaviest fills a storage from several peers: a
// newcomer evicts an item of the peer that stores the most, and that peer
// cannot push anyone out.
func TestStorageFullEvictsHeaviest(t *testing.T) {
	s := newLimitedStorage(limits{items: 100, peerItems: 60})
	for i := range 60 {
		if err := s.put(entFrom(fmt.Sprint("a", i), "", "A", "", 1, 1<<40), 0); err != nil {
			t.Fatal(err)
		}
	}
	for i := range 40 {
		if err := s.put(entFrom(fmt.Sprint("b", i), "", "B", "", 1, 1<<40), 0); err != nil {
			t.Fatal(err)
		}
	}
	// A short-lived honest record evicts an item of A, not B's.
	if err := s.put(entFrom("h", "", "H", "", 1, 10), 0); err != nil {
		t.Fatal(err)
	}
	if s.peers["A"].items != 59 || s.peers["B"].items != 40 || s.Len() != 100 {
		t.Fatalf("A %d B %d len %d", s.peers["A"].items, s.peers["B"].items, s.Len())
	}
	// B, lighter than A, may still evict A; A cannot evict anyone.
	if err := s.put(entFrom("b-more", "", "B", "", 1, 1<<40), 0); err != nil {
		t.Fatal(err)
	}
	if err := s.put(entFrom("a-more", "", "A", "", 1, 1<<40), 0); !errors.Is(err, ErrQuota) {
		t.Fatalf("heaviest peer evicted others: %v", err)
	}
	// The node's own records evict remote ones first.
	if err := s.put(ent("own", "", "v", 5), 0); err != nil || s.Len() != 100 || s.peers["A"].items != 57 {
		t.Fatalf("own record: %v, A holds %d", err, s.peers["A"].items)
	}
}

// checkStorage verifies the storage's bookkeeping against its contents.
func checkStorage(t *testing.T, s *storage) {
	t.Helper()
	n, size := 0, 0
	peers := map[string][2]int{}
	ips := map[string][2]int{}
	for key, rec := range s.keys {
		if len(rec.items) == 0 {
			t.Fatalf("empty record under %q", key)
		}
		writers, keyIPs := map[string]int{}, map[string]int{}
		for _, e := range rec.items {
			if w := writerOf(e); w != "" {
				writers[w]++
			}
			if e.ip != "" {
				keyIPs[e.ip]++
			}
		}
		if !maps.Equal(writers, rec.writers) || !maps.Equal(keyIPs, rec.ips) {
			t.Fatalf("key %q: counted writers %v and addresses %v, tracked %v %v", key, writers, keyIPs, rec.writers, rec.ips)
		}
		if rec.items[""] != nil && len(rec.items) > 1 {
			t.Fatalf("key %q holds a plain value and subkeys", key)
		}
		for sk, e := range rec.items {
			if e.Key != key || e.Subkey != sk {
				t.Fatalf("item %q/%q filed under %q/%q", e.Key, e.Subkey, key, sk)
			}
			n++
			size += e.size()
			if e.from != "" {
				p := peers[e.from]
				peers[e.from] = [2]int{p[0] + 1, p[1] + e.size()}
				if u := s.peers[e.from]; u == nil {
					t.Fatalf("peer %q untracked", e.from)
				} else if _, ok := u.refs[itemRef{key, sk}]; !ok {
					t.Fatalf("item %q/%q missing from its peer's refs", key, sk)
				}
			}
			if e.ip != "" {
				p := ips[e.ip]
				ips[e.ip] = [2]int{p[0] + 1, p[1] + e.size()}
			}
		}
	}
	if n != s.n || size != s.bytes {
		t.Fatalf("counted %d items %d bytes, storage says %d %d", n, size, s.n, s.bytes)
	}
	l := s.lim
	if l.items > 0 && n > l.items || l.bytes > 0 && size > l.bytes {
		t.Fatalf("%d items %d bytes over limits %+v", n, size, l)
	}
	if len(peers) != len(s.peers) || len(ips) != len(s.ips) {
		t.Fatalf("%d peers %d ips counted, storage tracks %d %d", len(peers), len(ips), len(s.peers), len(s.ips))
	}
	for p, c := range peers {
		u := s.peers[p]
		if u == nil {
			t.Fatalf("peer %q untracked", p)
		}
		if u.items != c[0] || u.bytes != c[1] || len(u.refs) != c[0] {
			t.Fatalf("peer %q: counted %v, tracked %+v", p, c, u)
		}
		if l.peerItems > 0 && c[0] > l.peerItems || l.peerBytes > 0 && c[1] > l.peerBytes {
			t.Fatalf("peer %q over quota: %v", p, c)
		}
	}
	for ip, c := range ips {
		u := s.ips[ip]
		if u == nil {
			t.Fatalf("ip %q untracked", ip)
		}
		if u.items != c[0] || u.bytes != c[1] {
			t.Fatalf("ip %q: counted %v, tracked %+v", ip, c, u)
		}
		if l.ipItems > 0 && c[0] > l.ipItems || l.ipBytes > 0 && c[1] > l.ipBytes {
			t.Fatalf("ip %q over quota: %v", ip, c)
		}
	}
}

// FuzzStorage drives a small storage with arbitrary stores from a few
// peers and addresses, cleanups and clock steps, checking after each
// operation that the bookkeeping is exact, every quota and limit holds,
// and no live dictionary was replaced by a plain value.
func FuzzStorage(f *testing.F) {
	f.Add([]byte{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15})
	f.Add([]byte{0x10, 0, 0x20, 0, 0x30, 9, 0xff, 0x11, 0x12, 0x80, 0x33, 0x40})
	f.Add([]byte{1, 0x81, 2, 0x82, 3, 0x83, 4, 0x84, 0xc0, 0xc1, 0xf0, 0xf1})
	f.Fuzz(func(t *testing.T, ops []byte) {
		s := newLimitedStorage(limits{items: 24, bytes: 24 * (entryOverhead + 16),
			peerItems: 8, peerBytes: 8 * (entryOverhead + 12), ipItems: 14, ipBytes: 14 * (entryOverhead + 14),
			keyWriterItems: 3, keyIPItems: 5})
		var now int64
		for i := 0; i+1 < len(ops); i += 2 {
			op, arg := ops[i], ops[i+1]
			switch {
			case op >= 0xf0:
				now += int64(arg)
				continue
			case op >= 0xe0:
				s.cleanup(now)
				checkStorage(t, s)
				continue
			}
			key := fmt.Sprint("k", op&3)
			sub := ""
			if op&4 != 0 {
				sub = fmt.Sprint(op >> 3 & 3)
			}
			from := ""
			if arg&0x80 == 0 {
				from = fmt.Sprint("p", arg&3)
			}
			ip := ""
			if arg&0x40 == 0 {
				ip = fmt.Sprint("ip", arg>>2&1)
			}
			e := &entry{Key: key, Subkey: sub, Value: make([]byte, arg>>3&15), Expiration: now + int64(arg&0x3f) - 8, from: from, ip: ip}
			liveDict := false
			if rec := s.keys[key]; rec != nil && rec.items[""] == nil {
				for _, it := range rec.items {
					liveDict = liveDict || it.Expiration > now
				}
			}
			err := s.put(e, now)
			if sub == "" && liveDict && err == nil {
				t.Fatalf("plain value replaced a live dictionary under %q", key)
			}
			if err == nil && s.keys[key].items[sub] != e {
				t.Fatalf("accepted entry not stored")
			}
			checkStorage(t, s)
		}
	})
}
