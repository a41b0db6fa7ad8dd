// Package moe holds what expert servers (package moe/server) and their
// clients (package moe/client) share: expert UIDs on a grid, the DHT records
// that announce experts, and the RPC protocol of Learning@home's decentralized
// mixture of experts.
//
// An expert UID is a prefix followed by one integer coordinate per grid
// dimension, joined by dots: "ffn.3.7" lives on the 2-D grid "ffn". A server
// announces every expert it hosts under the UID itself and under each of its
// prefixes, as hivemind's declare_experts does: key "ffn." gets subkey "3"
// and key "ffn.3." gets subkey "7", both with the expert's ExpertInfo as the
// value. A client's beam search walks these prefix keys one dimension at a
// time to find live experts without listing the whole grid.
package moe

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/core/protocol"

	"github.com/skyhive/skyhive/wire"
)

// Protocols of the expert RPC.
const (
	// ForwardProtocol runs an expert on a batch: request tensor "x",
	// response tensor "y".
	ForwardProtocol protocol.ID = "/skyhive/moe/forward/1.0.0"
	// BackwardProtocol sends "x" and the gradient "dy" of the loss with
	// respect to the expert's output; the server recomputes the forward
	// pass, applies its optimizer and answers with "dx".
	BackwardProtocol protocol.ID = "/skyhive/moe/backward/1.0.0"
	// InfoProtocol answers with the JSON Spec of one expert.
	InfoProtocol protocol.ID = "/skyhive/moe/info/1.0.0"
	// StatsProtocol answers with the server's JSON statistics (empty UID).
	StatsProtocol protocol.ID = "/skyhive/moe/stats/1.0.0"
)

// Delimiter separates the parts of an expert UID.
const Delimiter = "."

// MaxUIDLen bounds expert UIDs in bytes.
const MaxUIDLen = 255

// MaxInfoLen bounds an encoded ExpertInfo.
const MaxInfoLen = 8 << 10

// maxAddrs bounds the addresses of an ExpertInfo.
const maxAddrs = 16

// ErrUID reports a malformed expert UID or grid specification.
var ErrUID = errors.New("moe: malformed expert uid")

// ErrRequest reports a malformed expert request.
var ErrRequest = errors.New("moe: malformed request")

// SplitUID returns the prefix and the coordinates of a UID such as
// "ffn.3.7" ("ffn", [3 7]).
func SplitUID(uid string) (string, []int, error) {
	if len(uid) == 0 || len(uid) > MaxUIDLen {
		return "", nil, fmt.Errorf("%w: length %d", ErrUID, len(uid))
	}
	parts := strings.Split(uid, Delimiter)
	if len(parts) < 2 || parts[0] == "" {
		return "", nil, fmt.Errorf("%w: %q needs a prefix and at least one coordinate", ErrUID, uid)
	}
	coords := make([]int, len(parts)-1)
	for i, p := range parts[1:] {
		c, err := parseCoord(p)
		if err != nil {
			return "", nil, fmt.Errorf("%w: %q: %v", ErrUID, uid, err)
		}
		coords[i] = c
	}
	return parts[0], coords, nil
}

func parseCoord(s string) (int, error) {
	if s == "" || len(s) > 9 || (len(s) > 1 && s[0] == '0') {
		return 0, fmt.Errorf("bad coordinate %q", s)
	}
	for _, r := range s {
		if r < '0' || r > '9' {
			return 0, fmt.Errorf("bad coordinate %q", s)
		}
	}
	return strconv.Atoi(s)
}

// JoinUID builds a UID from a prefix and coordinates.
func JoinUID(prefix string, coords []int) string {
	var b strings.Builder
	b.WriteString(prefix)
	for _, c := range coords {
		b.WriteString(Delimiter)
		b.WriteString(strconv.Itoa(c))
	}
	return b.String()
}

// Record is one DHT entry announcing an expert.
type Record struct {
	Key, Subkey string
}

// Records lists the DHT entries that announce uid: the UID itself (no
// subkey) and, for each dimension d, the key made of the prefix and the
// first d coordinates (ending in a dot) with coordinate d as the subkey.
func Records(uid string) ([]Record, error) {
	prefix, coords, err := SplitUID(uid)
	if err != nil {
		return nil, err
	}
	rs := []Record{{Key: uid}}
	key := prefix + Delimiter
	for _, c := range coords {
		sub := strconv.Itoa(c)
		rs = append(rs, Record{Key: key, Subkey: sub})
		key += sub + Delimiter
	}
	return rs, nil
}

// Grid is the full expert grid a mixture-of-experts layer routes over.
type Grid struct {
	Prefix string
	Size   []int
}

// NumExperts is the product of the grid's sizes.
func (g Grid) NumExperts() int {
	n := 1
	for _, s := range g.Size {
		n *= s
	}
	return n
}

// TotalSize is the sum of the grid's sizes: the gating network's outputs.
func (g Grid) TotalSize() int {
	n := 0
	for _, s := range g.Size {
		n += s
	}
	return n
}

// Validate reports a grid that cannot be used.
func (g Grid) Validate() error {
	if g.Prefix == "" || strings.Contains(g.Prefix, Delimiter) || len(g.Prefix) > 64 {
		return fmt.Errorf("%w: grid prefix %q must be non-empty, dot-free and short", ErrUID, g.Prefix)
	}
	if len(g.Size) == 0 || len(g.Size) > 8 {
		return fmt.Errorf("%w: grid needs 1 to 8 dimensions, got %d", ErrUID, len(g.Size))
	}
	for _, s := range g.Size {
		if s < 1 || s > 1<<16 {
			return fmt.Errorf("%w: grid size %d out of range", ErrUID, s)
		}
	}
	return nil
}

// UIDs lists every expert of the grid in row-major order.
func (g Grid) UIDs() []string {
	out := make([]string, 0, g.NumExperts())
	coords := make([]int, len(g.Size))
	for {
		out = append(out, JoinUID(g.Prefix, coords))
		d := len(coords) - 1
		for d >= 0 {
			coords[d]++
			if coords[d] < g.Size[d] {
				break
			}
			coords[d] = 0
			d--
		}
		if d < 0 {
			return out
		}
	}
}

// ParseExperts expands a server's expert specification: a comma-separated
// list of UIDs or patterns such as "ffn.[0:16].[0:16]" (half-open ranges)
// or "ffn.3.[0:8]". It returns the UIDs in order, without duplicates, and at
// most maxExperts of them.
func ParseExperts(spec string, maxExperts int) ([]string, error) {
	var out []string
	seen := map[string]bool{}
	for pat := range strings.SplitSeq(spec, ",") {
		pat = strings.TrimSpace(pat)
		parts := strings.Split(pat, Delimiter)
		if len(parts) < 2 || parts[0] == "" || strings.ContainsAny(parts[0], "[]:") {
			return nil, fmt.Errorf("%w: pattern %q", ErrUID, pat)
		}
		ranges := make([][2]int, len(parts)-1)
		for i, p := range parts[1:] {
			if strings.HasPrefix(p, "[") && strings.HasSuffix(p, "]") {
				lo, hi, ok := strings.Cut(p[1:len(p)-1], ":")
				a, err1 := parseCoord(lo)
				b, err2 := parseCoord(hi)
				if !ok || err1 != nil || err2 != nil || b <= a {
					return nil, fmt.Errorf("%w: range %q in %q", ErrUID, p, pat)
				}
				ranges[i] = [2]int{a, b}
			} else {
				c, err := parseCoord(p)
				if err != nil {
					return nil, fmt.Errorf("%w: %q: %v", ErrUID, pat, err)
				}
				ranges[i] = [2]int{c, c + 1}
			}
		}
		total := 1
		for _, r := range ranges {
			total *= r[1] - r[0]
			if total > maxExperts {
				return nil, fmt.Errorf("%w: %q expands to more than %d experts", ErrUID, pat, maxExperts)
			}
		}
		coords := make([]int, len(ranges))
		for i, r := range ranges {
			coords[i] = r[0]
		}
		for {
			uid := JoinUID(parts[0], coords)
			if !seen[uid] {
				if len(out) >= maxExperts {
					return nil, fmt.Errorf("%w: more than %d experts", ErrUID, maxExperts)
				}
				seen[uid] = true
				out = append(out, uid)
			}
			d := len(coords) - 1
			for d >= 0 {
				coords[d]++
				if coords[d] < ranges[d][1] {
					break
				}
				coords[d] = ranges[d][0]
				d--
			}
			if d < 0 {
				break
			}
		}
	}
	for _, uid := range out {
		if _, _, err := SplitUID(uid); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// ExpertInfo is the value of an expert's DHT records: its UID, where its
// server listens and, from servers that say, what the expert is (its type
// and hidden size), so that a trainer can check that it can call it
// before it does.
type ExpertInfo struct {
	UID  string        `json:"uid"`
	Peer peer.AddrInfo `json:"peer"`
	// Type is the expert's type (e.g. "ffn"); empty if not declared.
	Type string `json:"type,omitempty"`
	// Hidden is the expert's hidden size; 0 if not declared.
	Hidden int `json:"hidden,omitempty"`
}

// MaxHidden bounds the hidden size an ExpertInfo may declare.
const MaxHidden = 1 << 16

// maxTypeLen bounds the type an ExpertInfo may declare.
const maxTypeLen = 32

// checkSpec reports a declared type or hidden size out of bounds: a type
// must be at most 32 lower-case letters, digits or dashes, and a hidden
// size in [0, MaxHidden].
func (e ExpertInfo) checkSpec() error {
	if e.Hidden < 0 || e.Hidden > MaxHidden {
		return fmt.Errorf("%w: expert %s declares hidden size %d, not in [0, %d]", ErrRequest, e.UID, e.Hidden, MaxHidden)
	}
	if len(e.Type) > maxTypeLen {
		return fmt.Errorf("%w: expert %s declares a type of %d bytes", ErrRequest, e.UID, len(e.Type))
	}
	for _, r := range e.Type {
		if (r < 'a' || r > 'z') && (r < '0' || r > '9') && r != '-' {
			return fmt.Errorf("%w: expert %s declares type %q", ErrRequest, e.UID, e.Type)
		}
	}
	return nil
}

// MarshalInfo encodes an ExpertInfo for the DHT.
func MarshalInfo(e ExpertInfo) ([]byte, error) {
	if _, _, err := SplitUID(e.UID); err != nil {
		return nil, err
	}
	if err := e.checkSpec(); err != nil {
		return nil, err
	}
	if len(e.Peer.Addrs) > maxAddrs {
		e.Peer.Addrs = e.Peer.Addrs[:maxAddrs]
	}
	b, err := json.Marshal(e)
	if err != nil {
		return nil, fmt.Errorf("moe: encode expert info: %w", err)
	}
	if len(b) > MaxInfoLen {
		return nil, fmt.Errorf("moe: expert info of %d bytes exceeds %d", len(b), MaxInfoLen)
	}
	return b, nil
}

// UnmarshalInfo decodes and validates an ExpertInfo read from the DHT.
func UnmarshalInfo(b []byte) (ExpertInfo, error) {
	var e ExpertInfo
	if len(b) > MaxInfoLen {
		return e, fmt.Errorf("%w: expert info of %d bytes", ErrRequest, len(b))
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	if err := dec.Decode(&e); err != nil {
		return ExpertInfo{}, fmt.Errorf("moe: decode expert info: %w", err)
	}
	if _, _, err := SplitUID(e.UID); err != nil {
		return ExpertInfo{}, err
	}
	if e.Peer.ID == "" || len(e.Peer.Addrs) > maxAddrs {
		return ExpertInfo{}, fmt.Errorf("%w: expert info for %s without a peer or with too many addresses", ErrRequest, e.UID)
	}
	if err := e.checkSpec(); err != nil {
		return ExpertInfo{}, err
	}
	return e, nil
}

// Spec describes a hosted expert (the answer of InfoProtocol).
type Spec struct {
	UID    string `json:"uid"`
	Type   string `json:"type"`
	Hidden int    `json:"hidden"`
	// InputDims is the rank the expert accepts: 2 ([batch, hidden]) or 3
	// ([batch, seq, hidden]).
	InputDims int `json:"input_dims"`
}

// requestMagic starts every expert request.
var requestMagic = [4]byte{'S', 'K', 'X', 1}

// EncodeRequest builds an expert request: a 4-byte header "SKX" + version
// 1, the UID's length (one byte) and bytes, then a wire message of named
// tensors.
func EncodeRequest(uid string, msg []wire.Named, o wire.Options) ([]byte, error) {
	if len(uid) > MaxUIDLen {
		return nil, fmt.Errorf("%w: uid of %d bytes", ErrUID, len(uid))
	}
	var buf bytes.Buffer
	buf.Grow(len(requestMagic) + 1 + len(uid) + wire.MessageSize(msg, o))
	buf.Write(requestMagic[:])
	buf.WriteByte(byte(len(uid)))
	buf.WriteString(uid)
	if err := wire.EncodeMessage(&buf, msg, o); err != nil {
		return nil, fmt.Errorf("moe: encode request: %w", err)
	}
	return buf.Bytes(), nil
}

// DecodeRequest parses an expert request, checking every size against lim
// before allocating for it.
func DecodeRequest(b []byte, lim wire.Limits) (string, []wire.Named, error) {
	return DecodeRequestFor(b, func(string) (wire.Limits, error) { return lim, nil })
}

// DecodeRequestFor parses an expert request like DecodeRequest, with the
// limits that limits returns for the request's UID. It is called before
// any tensor is decoded, so a server can refuse an expert it does not host
// and hold each tensor to that expert's input shape (wire.Limits.Shape)
// before allocating for it; its error is returned wrapped in ErrRequest.
func DecodeRequestFor(b []byte, limits func(uid string) (wire.Limits, error)) (string, []wire.Named, error) {
	if len(b) < 5 || !bytes.Equal(b[:4], requestMagic[:]) {
		return "", nil, fmt.Errorf("%w: bad header", ErrRequest)
	}
	n := int(b[4])
	if len(b) < 5+n {
		return "", nil, fmt.Errorf("%w: truncated uid", ErrRequest)
	}
	uid := string(b[5 : 5+n])
	lim, err := limits(uid)
	if err != nil {
		return "", nil, fmt.Errorf("%w: %w", ErrRequest, err)
	}
	msg, err := wire.UnmarshalMessage(b[5+n:], lim)
	if err != nil {
		return "", nil, fmt.Errorf("%w: %w", ErrRequest, err)
	}
	return uid, msg, nil
}
