package dht

import (
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/libp2p/go-libp2p/core/peer"
	ma "github.com/multiformats/go-multiaddr"
)

// Wire format. Every message starts with a version byte and a type byte;
// integers are big-endian; strings and byte fields carry a length prefix
// (2 bytes, or 4 for values). Requests then carry a flags byte and the
// sender's addresses, and responses the type-specific body:
//
//	PING       request: -                       response: -
//	STORE      request: cache flag, entries     response: accepted flag per entry
//	FIND_NODE  request: 32-byte target          response: peers
//	FIND_VALUE request: key                     response: items, peers
//
// entry = key, subkey, value, expiration (int64 unix ns), signature;
// item  = subkey, value, expiration, signature;
// peer  = id (1-byte length), address count (1 byte), addresses.

const wireVersion = 1

type msgType uint8

const (
	msgPing msgType = iota + 1
	msgStore
	msgFindNode
	msgFindValue
)

func (t msgType) String() string {
	switch t {
	case msgPing:
		return "PING"
	case msgStore:
		return "STORE"
	case msgFindNode:
		return "FIND_NODE"
	case msgFindValue:
		return "FIND_VALUE"
	}
	return fmt.Sprintf("type(%d)", uint8(t))
}

// Hard limits of the wire format; a node's Config may be stricter.
const (
	// MaxMessageSize bounds any request or response.
	MaxMessageSize = 4 << 20
	// MaxKeyLen bounds keys and subkeys in bytes.
	MaxKeyLen = 1024
	// MaxValueLen bounds values in bytes.
	MaxValueLen = 1 << 20
	// MaxSignatureLen bounds record signatures.
	MaxSignatureLen = 512
	// MaxStoreBatch bounds the entries of one STORE request.
	MaxStoreBatch = 256
	// MaxItems bounds the items of one FIND_VALUE response.
	MaxItems = 4096
	// MaxPeers bounds the peers of one response.
	MaxPeers = 64
	// MaxAddrs bounds the addresses given for one peer.
	MaxAddrs = 16
	// MaxAddrLen bounds one encoded multiaddr.
	MaxAddrLen = 512
	// maxIDLen bounds an encoded peer ID.
	maxIDLen = 128
	// targetLen is the size of a keyspace point (sha256).
	targetLen = 32
)

var errMalformed = errors.New("dht: malformed message")

type request struct {
	Type    msgType
	Client  bool           // sender does not serve; do not add it to routing tables
	Addrs   []ma.Multiaddr // sender's addresses
	Cache   bool           // STORE: entries are cached copies
	Entries []*entry       // STORE
	Target  []byte         // FIND_NODE
	Key     string         // FIND_VALUE
}

type response struct {
	Type     msgType
	Accepted []bool          // STORE
	Items    []*entry        // FIND_VALUE (Key left empty)
	Peers    []peer.AddrInfo // FIND_NODE, FIND_VALUE
}

func encodeRequest(r *request) ([]byte, error) {
	b := []byte{wireVersion, byte(r.Type), 0}
	if r.Client {
		b[2] |= 1
	}
	var err error
	if b, err = appendAddrs(b, r.Addrs); err != nil {
		return nil, err
	}
	switch r.Type {
	case msgPing:
	case msgStore:
		if len(r.Entries) > MaxStoreBatch {
			return nil, fmt.Errorf("dht: %d entries in one STORE, max %d", len(r.Entries), MaxStoreBatch)
		}
		var flags byte
		if r.Cache {
			flags = 1
		}
		b = append(b, flags)
		b = binary.BigEndian.AppendUint16(b, uint16(len(r.Entries)))
		for _, e := range r.Entries {
			if b, err = appendString(b, e.Key); err != nil {
				return nil, err
			}
			if b, err = appendItem(b, e); err != nil {
				return nil, err
			}
		}
	case msgFindNode:
		if len(r.Target) != targetLen {
			return nil, fmt.Errorf("dht: target of %d bytes", len(r.Target))
		}
		b = append(b, r.Target...)
	case msgFindValue:
		if b, err = appendString(b, r.Key); err != nil {
			return nil, err
		}
	default:
		return nil, fmt.Errorf("dht: encode unknown %s", r.Type)
	}
	return checkSize(b)
}

func decodeRequest(data []byte) (*request, error) {
	d := decoder{b: data}
	if len(data) > MaxMessageSize {
		return nil, fmt.Errorf("%w: %d bytes", errMalformed, len(data))
	}
	r := &request{}
	if v := d.u8(); v != wireVersion && d.err == nil {
		return nil, fmt.Errorf("%w: version %d", errMalformed, v)
	}
	r.Type = msgType(d.u8())
	flags := d.u8()
	if flags&^1 != 0 {
		d.fail("unknown flags")
	}
	r.Client = flags&1 != 0
	r.Addrs = d.addrs()
	switch r.Type {
	case msgPing:
	case msgStore:
		cf := d.u8()
		if cf&^1 != 0 {
			d.fail("unknown store flags")
		}
		r.Cache = cf&1 != 0
		n := int(d.u16())
		if n > MaxStoreBatch {
			d.fail("too many entries")
		}
		for i := 0; i < n && d.err == nil; i++ {
			key := d.str()
			e := d.item()
			if d.err == nil {
				e.Key = key
				r.Entries = append(r.Entries, e)
			}
		}
	case msgFindNode:
		r.Target = d.bytes(targetLen)
	case msgFindValue:
		r.Key = d.str()
	default:
		d.fail("unknown type")
	}
	if err := d.finish(); err != nil {
		return nil, err
	}
	return r, nil
}

func encodeResponse(r *response) ([]byte, error) {
	b := []byte{wireVersion, byte(r.Type)}
	var err error
	switch r.Type {
	case msgPing:
	case msgStore:
		if len(r.Accepted) > MaxStoreBatch {
			return nil, fmt.Errorf("dht: %d store results", len(r.Accepted))
		}
		b = binary.BigEndian.AppendUint16(b, uint16(len(r.Accepted)))
		for _, ok := range r.Accepted {
			if ok {
				b = append(b, 1)
			} else {
				b = append(b, 0)
			}
		}
	case msgFindValue:
		if len(r.Items) > MaxItems {
			return nil, fmt.Errorf("dht: %d items", len(r.Items))
		}
		b = binary.BigEndian.AppendUint16(b, uint16(len(r.Items)))
		for _, e := range r.Items {
			if b, err = appendItem(b, e); err != nil {
				return nil, err
			}
		}
		fallthrough
	case msgFindNode:
		if b, err = appendPeers(b, r.Peers); err != nil {
			return nil, err
		}
	default:
		return nil, fmt.Errorf("dht: encode unknown %s", r.Type)
	}
	return checkSize(b)
}

func decodeResponse(data []byte) (*response, error) {
	d := decoder{b: data}
	if len(data) > MaxMessageSize {
		return nil, fmt.Errorf("%w: %d bytes", errMalformed, len(data))
	}
	r := &response{}
	if v := d.u8(); v != wireVersion && d.err == nil {
		return nil, fmt.Errorf("%w: version %d", errMalformed, v)
	}
	r.Type = msgType(d.u8())
	switch r.Type {
	case msgPing:
	case msgStore:
		n := int(d.u16())
		if n > MaxStoreBatch {
			d.fail("too many store results")
		}
		for i := 0; i < n && d.err == nil; i++ {
			switch d.u8() {
			case 0:
				r.Accepted = append(r.Accepted, false)
			case 1:
				r.Accepted = append(r.Accepted, true)
			default:
				d.fail("bad store result")
			}
		}
	case msgFindValue:
		n := int(d.u16())
		if n > MaxItems {
			d.fail("too many items")
		}
		for i := 0; i < n && d.err == nil; i++ {
			if e := d.item(); d.err == nil {
				r.Items = append(r.Items, e)
			}
		}
		fallthrough
	case msgFindNode:
		r.Peers = d.peers()
	default:
		d.fail("unknown type")
	}
	if err := d.finish(); err != nil {
		return nil, err
	}
	return r, nil
}

func checkSize(b []byte) ([]byte, error) {
	if len(b) > MaxMessageSize {
		return nil, fmt.Errorf("dht: message of %d bytes exceeds %d", len(b), MaxMessageSize)
	}
	return b, nil
}

func appendString(b []byte, s string) ([]byte, error) {
	if len(s) > MaxKeyLen {
		return nil, fmt.Errorf("%w: key of %d bytes, max %d", ErrTooLarge, len(s), MaxKeyLen)
	}
	b = binary.BigEndian.AppendUint16(b, uint16(len(s)))
	return append(b, s...), nil
}

func appendItem(b []byte, e *entry) ([]byte, error) {
	if len(e.Value) > MaxValueLen {
		return nil, fmt.Errorf("%w: value of %d bytes, max %d", ErrTooLarge, len(e.Value), MaxValueLen)
	}
	if len(e.Signature) > MaxSignatureLen {
		return nil, fmt.Errorf("%w: signature of %d bytes", ErrTooLarge, len(e.Signature))
	}
	b, err := appendString(b, e.Subkey)
	if err != nil {
		return nil, err
	}
	b = binary.BigEndian.AppendUint32(b, uint32(len(e.Value)))
	b = append(b, e.Value...)
	b = binary.BigEndian.AppendUint64(b, uint64(e.Expiration))
	b = binary.BigEndian.AppendUint16(b, uint16(len(e.Signature)))
	return append(b, e.Signature...), nil
}

func appendAddrs(b []byte, addrs []ma.Multiaddr) ([]byte, error) {
	if len(addrs) > MaxAddrs {
		addrs = addrs[:MaxAddrs]
	}
	b = append(b, byte(len(addrs)))
	for _, a := range addrs {
		ab := a.Bytes()
		if len(ab) > MaxAddrLen {
			return nil, fmt.Errorf("dht: address of %d bytes", len(ab))
		}
		b = binary.BigEndian.AppendUint16(b, uint16(len(ab)))
		b = append(b, ab...)
	}
	return b, nil
}

func appendPeers(b []byte, peers []peer.AddrInfo) ([]byte, error) {
	if len(peers) > MaxPeers {
		return nil, fmt.Errorf("dht: %d peers in one response, max %d", len(peers), MaxPeers)
	}
	b = append(b, byte(len(peers)))
	for _, p := range peers {
		id := []byte(p.ID)
		if len(id) == 0 || len(id) > maxIDLen {
			return nil, fmt.Errorf("dht: peer id of %d bytes", len(id))
		}
		b = append(b, byte(len(id)))
		b = append(b, id...)
		var err error
		if b, err = appendAddrs(b, p.Addrs); err != nil {
			return nil, err
		}
	}
	return b, nil
}

// decoder reads a message, recording the first error; reads after an error
// return zero values.
type decoder struct {
	b   []byte
	err error
}

func (d *decoder) fail(what string) {
	if d.err == nil {
		d.err = fmt.Errorf("%w: %s", errMalformed, what)
	}
}

func (d *decoder) bytes(n int) []byte {
	if d.err != nil {
		return nil
	}
	if n < 0 || n > len(d.b) {
		d.fail("truncated")
		return nil
	}
	out := d.b[:n:n]
	d.b = d.b[n:]
	return out
}

func (d *decoder) u8() uint8 {
	if b := d.bytes(1); b != nil {
		return b[0]
	}
	return 0
}

func (d *decoder) u16() uint16 {
	if b := d.bytes(2); b != nil {
		return binary.BigEndian.Uint16(b)
	}
	return 0
}

func (d *decoder) u32() uint32 {
	if b := d.bytes(4); b != nil {
		return binary.BigEndian.Uint32(b)
	}
	return 0
}

func (d *decoder) u64() uint64 {
	if b := d.bytes(8); b != nil {
		return binary.BigEndian.Uint64(b)
	}
	return 0
}

func (d *decoder) str() string {
	n := int(d.u16())
	if n > MaxKeyLen {
		d.fail("key too long")
		return ""
	}
	return string(d.bytes(n))
}

// item reads subkey, value, expiration and signature into a new entry whose
// slices do not alias the message.
func (d *decoder) item() *entry {
	e := &entry{Subkey: d.str()}
	n := int(d.u32())
	if n > MaxValueLen {
		d.fail("value too long")
		return e
	}
	if v := d.bytes(n); v != nil {
		e.Value = append([]byte{}, v...)
	}
	e.Expiration = int64(d.u64())
	n = int(d.u16())
	if n > MaxSignatureLen {
		d.fail("signature too long")
		return e
	}
	if s := d.bytes(n); len(s) > 0 {
		e.Signature = append([]byte(nil), s...)
	}
	return e
}

func (d *decoder) addrs() []ma.Multiaddr {
	n := int(d.u8())
	if n > MaxAddrs {
		d.fail("too many addresses")
		return nil
	}
	var out []ma.Multiaddr
	for i := 0; i < n && d.err == nil; i++ {
		l := int(d.u16())
		if l > MaxAddrLen {
			d.fail("address too long")
			return nil
		}
		raw := d.bytes(l)
		if d.err != nil {
			return nil
		}
		a, err := ma.NewMultiaddrBytes(append([]byte(nil), raw...))
		if err != nil {
			d.fail("bad address")
			return nil
		}
		out = append(out, a)
	}
	return out
}

func (d *decoder) peers() []peer.AddrInfo {
	n := int(d.u8())
	if n > MaxPeers {
		d.fail("too many peers")
		return nil
	}
	var out []peer.AddrInfo
	for i := 0; i < n && d.err == nil; i++ {
		l := int(d.u8())
		if l == 0 || l > maxIDLen {
			d.fail("bad peer id length")
			return nil
		}
		raw := d.bytes(l)
		if d.err != nil {
			return nil
		}
		id, err := peer.IDFromBytes(raw)
		if err != nil {
			d.fail("bad peer id")
			return nil
		}
		out = append(out, peer.AddrInfo{ID: id, Addrs: d.addrs()})
	}
	return out
}

func (d *decoder) finish() error {
	if d.err != nil {
		return d.err
	}
	if len(d.b) != 0 {
		return fmt.Errorf("%w: %d trailing bytes", errMalformed, len(d.b))
	}
	return nil
}
