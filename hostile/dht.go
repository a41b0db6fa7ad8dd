package hostile

import (
	"context"
	"crypto/rand"
	"fmt"
	"math"
	"sync/atomic"
	"time"

	"github.com/libp2p/go-libp2p/core/crypto"
	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/skyhive/skyhive/dht"
	"github.com/skyhive/skyhive/metrics"
	"github.com/skyhive/skyhive/moe"
	"github.com/skyhive/skyhive/p2p"
)

// DHTTarget describes a DHT node to attack and the records worth
// attacking on it.
type DHTTarget struct {
	Node peer.AddrInfo
	// Declared are records honest peers declared (such as moe.Records of
	// the experts a server hosts): the attacks try to erase the
	// dictionaries they live in, take over their subkeys and forge their
	// writers' signatures. Without them the attacks use "ffn." subkey "0".
	Declared []moe.Record
	// Owner is the peer that wrote Declared (for forged signatures); a
	// random identity without it.
	Owner peer.ID
	// CrowdKeys, if set, gives the keys the crowding attack fills, asked
	// before each request, as an attacker that watches what peers read
	// would choose them (default: the status key, the experts' prefix and
	// the dictionaries of Declared).
	CrowdKeys func() []string
	// MaxTTL is the longest expiration the node accepts (dht.DefaultMaxTTL
	// without it); the erasure uses almost all of it, the far-future
	// records ten times it.
	MaxTTL time.Duration
}

// floodRecords and floodValueBytes size one request of the storage flood:
// 256 records of 4 KiB, 1 MiB in all.
const (
	floodRecords    = dht.MaxStoreBatch
	floodValueBytes = 4 << 10
)

// DHTAttacks are requests a DHT node must refuse: a plain value over a
// dictionary of subkeys (the "erased routing" of issue 13) and subkeys
// that other peers own (both tried only where the node holds them: a node
// that does not is not attacked by them; ErrNotApplicable), records with a forged writer's signature, records that
// expire far in the future, a 4 GiB length prefix, and two the node may
// absorb within its bounds: a storage flood of 1 MiB STOREs from each
// identity (bounded by the per-peer and per-address quotas), PINGs that
// ask each identity into the routing table (bounded per address), and
// long-lived subkeys under the keys many peers declare under (the status
// key, the declared experts' prefixes), which would crowd the honest
// declarations out of readers' answers (bounded per writer and address
// under each key, and answers shared among writers).
func DHTAttacks(t DHTTarget) []Attack {
	a := newDHTAttacker(t)
	to := a.to
	return toVictim(to.ID, []Attack{
		{Name: "dht-erase-dictionary", Bytes: 128, Send: a.eraseDictionary},
		{Name: "dht-hijack-subkey", Bytes: 512, Send: a.hijackSubkey},
		{Name: "dht-forged-signature", Bytes: 512, Send: a.forgedSignature},
		{Name: "dht-far-future", Bytes: 128, Send: a.farFuture},
		{Name: "dht-storage-flood", Bytes: floodRecords * (floodValueBytes + 32), Absorbed: true, Send: a.storageFlood},
		{Name: "dht-sybil-ping", Bytes: 128, Absorbed: true, Send: a.sybilPing},
		{Name: "dht-crowd-key", Bytes: floodRecords * 96, Absorbed: true, Send: a.crowdKey},
		{Name: "huge-length-prefix", Bytes: 4, Send: func(ctx context.Context, h *p2p.Host) error {
			return sendLengthPrefix(ctx, h, to, dht.ProtocolID, math.MaxUint32)
		}},
	})
}

// dhtAttacker sends the DHT attacks to one node.
type dhtAttacker struct {
	to     peer.AddrInfo
	dicts  []moe.Record // the declared dictionaries' subkeys, attacked in turn
	maxTTL time.Duration
	owner  peer.ID
	// crowdKeys is DHTTarget.CrowdKeys.
	crowdKeys func() []string
	turn      atomic.Uint64
	junk      atomic.Uint64 // numbers the junk records' keys
}

// newDHTAttacker fills in t's defaults.
func newDHTAttacker(t DHTTarget) *dhtAttacker {
	a := &dhtAttacker{to: t.Node, maxTTL: t.MaxTTL, owner: t.Owner, crowdKeys: t.CrowdKeys}
	decl := t.Declared
	if len(decl) == 0 {
		decl = []moe.Record{{Key: "ffn.", Subkey: "0"}}
	}
	for _, r := range decl {
		if r.Subkey != "" {
			a.dicts = append(a.dicts, r)
		}
	}
	if len(a.dicts) == 0 {
		a.dicts = []moe.Record{{Key: "ffn.", Subkey: "0"}}
	}
	if a.maxTTL <= 0 {
		a.maxTTL = dht.DefaultMaxTTL
	}
	if a.owner == "" {
		a.owner = randomID()
	}
	return a
}

// next is the next declared record to attack.
func (a *dhtAttacker) next() moe.Record {
	return a.dicts[int(a.turn.Add(1)%uint64(len(a.dicts)))]
}

// store sends records, signed by the sender unless they carry a
// signature, and fails unless the node accepted every one.
func (a *dhtAttacker) store(ctx context.Context, h *p2p.Host, client bool, recs ...dht.RawRecord) error {
	req, err := dht.EncodeStore(recs, privKey(h), client)
	if err != nil {
		return err
	}
	resp, err := h.Call(ctx, a.to, dht.ProtocolID, req)
	if err != nil {
		return err
	}
	ok, err := dht.DecodeStoreResponse(resp)
	if err != nil {
		return err
	}
	for i, acc := range ok {
		if !acc {
			return fmt.Errorf("%w: record %d of %d", ErrNotAccepted, i+1, len(ok))
		}
	}
	return nil
}

// holds says whether the node holds key's dictionary (subkey "") or
// subkey of it: an erasure or a takeover of a record the node does
// not hold attacks nothing there (it would be its first writer).
func (a *dhtAttacker) holds(ctx context.Context, h *p2p.Host, key, subkey string) error {
	req, err := dht.EncodeFindValue(key)
	if err != nil {
		return err
	}
	resp, err := h.Call(ctx, a.to, dht.ProtocolID, req)
	if err != nil {
		return err
	}
	recs, err := dht.DecodeFindValueResponse(key, resp)
	if err != nil {
		return err
	}
	for _, r := range recs {
		if r.Subkey != "" && (subkey == "" || r.Subkey == subkey) {
			return nil
		}
	}
	return ErrNotApplicable
}

// expertValue is an expert record value pointing at h.
func expertValue(h *p2p.Host) []byte {
	b, err := moe.MarshalInfo(moe.ExpertInfo{UID: "hostile.0", Peer: h.AddrInfo()})
	if err != nil {
		return []byte("hostile")
	}
	return b
}

// eraseDictionary overwrites a dictionary the node holds with a plain
// value.
func (a *dhtAttacker) eraseDictionary(ctx context.Context, h *p2p.Host) error {
	r := a.next()
	if err := a.holds(ctx, h, r.Key, ""); err != nil {
		return err
	}
	return a.store(ctx, h, true, dht.RawRecord{Key: r.Key, Value: []byte("erased"), Expiration: time.Now().Add(a.maxTTL - time.Minute)})
}

// hijackSubkey overwrites another peer's subkey the node holds.
func (a *dhtAttacker) hijackSubkey(ctx context.Context, h *p2p.Host) error {
	r := a.next()
	if err := a.holds(ctx, h, r.Key, r.Subkey); err != nil {
		return err
	}
	return a.store(ctx, h, true, dht.RawRecord{Key: r.Key, Subkey: r.Subkey, Value: expertValue(h), Expiration: time.Now().Add(a.maxTTL / 2)})
}

// forgedSignature stores a subkey with the owner's ID and a random
// signature.
func (a *dhtAttacker) forgedSignature(ctx context.Context, h *p2p.Host) error {
	r := a.next()
	// The writer signature format: the writer's ID (one length
	// byte, then the ID), then its signature, here random bytes.
	sig := append([]byte{byte(len(a.owner))}, a.owner...)
	sig = append(sig, randomBytes(64)...)
	return a.store(ctx, h, true, dht.RawRecord{Key: r.Key, Subkey: r.Subkey, Value: expertValue(h), Expiration: time.Now().Add(a.maxTTL / 2), Signature: sig})
}

// farFuture stores a record expiring ten times the maximum TTL ahead.
func (a *dhtAttacker) farFuture(ctx context.Context, h *p2p.Host) error {
	key := fmt.Sprintf("hostile.future.%d", a.junk.Add(1))
	return a.store(ctx, h, true, dht.RawRecord{Key: key, Value: []byte("junk"), Expiration: time.Now().Add(10 * a.maxTTL)})
}

// storageFlood stores floodRecords junk records of floodValueBytes.
func (a *dhtAttacker) storageFlood(ctx context.Context, h *p2p.Host) error {
	recs := make([]dht.RawRecord, floodRecords)
	exp := time.Now().Add(a.maxTTL / 2)
	base := a.junk.Add(floodRecords)
	value := randomBytes(floodValueBytes)
	for i := range recs {
		recs[i] = dht.RawRecord{Key: fmt.Sprintf("hostile.junk.%s.%d", h.ID().ShortString(), base+uint64(i)), Value: value, Expiration: exp}
	}
	return a.store(ctx, h, true, recs...)
}

// crowdKey stores floodRecords long-lived subkeys under a key that
// honest peers declare under, in turn the status key and the declared
// dictionaries' keys.
func (a *dhtAttacker) crowdKey(ctx context.Context, h *p2p.Host) error {
	keys := []string{metrics.StatusKey, "ffn."}
	for _, d := range a.dicts {
		keys = append(keys, d.Key)
	}
	if a.crowdKeys != nil {
		keys = a.crowdKeys()
	}
	if len(keys) == 0 {
		return ErrNotApplicable
	}
	n := a.junk.Add(floodRecords)
	key := keys[n/floodRecords%uint64(len(keys))]
	exp := time.Now().Add(a.maxTTL / 2)
	recs := make([]dht.RawRecord, floodRecords)
	for i := range recs {
		recs[i] = dht.RawRecord{Key: key, Subkey: fmt.Sprintf("crowd.%s.%d", h.ID().ShortString(), n+uint64(i)), Value: []byte("junk"), Expiration: exp}
	}
	return a.store(ctx, h, true, recs...)
}

// sybilPing asks the node to add h's identity to its routing table.
func (a *dhtAttacker) sybilPing(ctx context.Context, h *p2p.Host) error {
	req, err := dht.EncodePing(h.AddrInfo().Addrs)
	if err != nil {
		return err
	}
	_, err = h.Call(ctx, a.to, dht.ProtocolID, req)
	return err
}

// privKey is h's private key (nil if the peerstore does not hold it: the
// records then go unsigned).
func privKey(h *p2p.Host) crypto.PrivKey {
	return h.LibP2P().Peerstore().PrivKey(h.ID())
}

func randomBytes(n int) []byte {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return b
}

// randomID is the peer ID of a fresh key, for forged writers.
func randomID() peer.ID {
	_, pub, err := crypto.GenerateEd25519Key(rand.Reader)
	if err != nil {
		return peer.ID("hostile")
	}
	id, err := peer.IDFromPublicKey(pub)
	if err != nil {
		return peer.ID("hostile")
	}
	return id
}
