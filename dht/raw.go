package dht

import (
	"fmt"
	"time"

	"github.com/libp2p/go-libp2p/core/crypto"
	"github.com/libp2p/go-libp2p/core/peer"
	ma "github.com/multiformats/go-multiaddr"
)

// Raw requests let a caller send what an honest node never would: records
// with far expirations, plain values over dictionaries, forged signatures.
// The hostile peer (package hostile) and tests use them to check that
// nodes refuse such requests; a Node never needs them.

// RawRecord is one record of a STORE as it travels on the wire.
type RawRecord struct {
	Key, Subkey string
	Value       []byte
	Expiration  time.Time
	// Signature, if not nil, is sent as it is (a forgery); otherwise the
	// record is signed as a node holding EncodeStore's key would sign it.
	Signature []byte
}

// EncodeStore encodes a STORE request of records (at most MaxStoreBatch),
// from a node that serves (client false: it asks to enter the receiver's
// routing table) or not. Records without a Signature are signed with priv
// as a node with that key signs its own (subkey items by their writer,
// owner-marked records by their owner; a record owned by another peer is
// sent unsigned), or left unsigned if priv is nil. Only the wire format's
// limits are checked, not a node's: what a node refuses is the point.
func EncodeStore(records []RawRecord, priv crypto.PrivKey, client bool) ([]byte, error) {
	var self peer.ID
	if priv != nil {
		id, err := peer.IDFromPrivateKey(priv)
		if err != nil {
			return nil, fmt.Errorf("dht: raw store: %w", err)
		}
		self = id
	}
	es := make([]*entry, len(records))
	for i, r := range records {
		e := &entry{Key: r.Key, Subkey: r.Subkey, Value: r.Value, Expiration: r.Expiration.UnixNano()}
		if e.Value == nil {
			e.Value = []byte{}
		}
		switch {
		case r.Signature != nil:
			e.Signature = r.Signature
		case priv != nil:
			// A record owned by another peer cannot be signed: it goes
			// unsigned, which the receiver must refuse.
			_ = sign(e, self, priv)
		}
		es[i] = e
	}
	return encodeRequest(&request{Type: msgStore, Client: client, Entries: es})
}

// DecodeStoreResponse returns, for each record of a STORE, whether the
// node accepted it.
func DecodeStoreResponse(b []byte) ([]bool, error) {
	r, err := decodeResponse(b)
	if err != nil {
		return nil, err
	}
	if r.Type != msgStore {
		return nil, fmt.Errorf("%w: %s in answer to a STORE", errMalformed, r.Type)
	}
	return r.Accepted, nil
}

// EncodePing encodes a PING from a node that serves at addrs: the
// receiver may add the sender to its routing table.
func EncodePing(addrs []ma.Multiaddr) ([]byte, error) {
	return encodeRequest(&request{Type: msgPing, Addrs: addrs})
}

// EncodeFindValue encodes a FIND_VALUE for key from a client.
func EncodeFindValue(key string) ([]byte, error) {
	return encodeRequest(&request{Type: msgFindValue, Client: true, Key: key})
}

// DecodeFindValueResponse returns the records of key a node answered a
// FIND_VALUE with (their signatures unchecked).
func DecodeFindValueResponse(key string, b []byte) ([]RawRecord, error) {
	r, err := decodeResponse(b)
	if err != nil {
		return nil, err
	}
	if r.Type != msgFindValue {
		return nil, fmt.Errorf("%w: %s in answer to a FIND_VALUE", errMalformed, r.Type)
	}
	out := make([]RawRecord, len(r.Items))
	for i, e := range r.Items {
		out[i] = RawRecord{Key: key, Subkey: e.Subkey, Value: e.Value, Expiration: time.Unix(0, e.Expiration), Signature: e.Signature}
	}
	return out, nil
}
