package averaging

import (
	"encoding/binary"
	"errors"
	"fmt"
)

// Protocols spoken by an Averager.
const (
	// ReduceProtocol carries one chunk of a member's contribution to the
	// chunk's reducer; the response is the chunk's average.
	ReduceProtocol = "/skyhive/averaging/reduce/1.0.0"
	// LeaveProtocol tells the members of a session that the sender leaves
	// it (it was stopped) or declines it (it will not join), so that they
	// stop waiting for it at once.
	LeaveProtocol = "/skyhive/averaging/leave/1.0.0"
	// RosterProtocol is how the peers of a fixed roster (rank
	// matchmaking, package averaging/peer) agree on it and start
	// together: asked with the run ID, a peer answers, in JSON, the
	// roster it proposes ("peers", sorted peer IDs), whether that is
	// final ("final") and whether it can take its first step ("ready").
	// Answering proves a peer alive before the barrier.
	RosterProtocol = "/skyhive/averaging/roster/1.0.0"
)

// Hard limits of the message formats.
const (
	// MaxSessionLen bounds a session ID in bytes.
	MaxSessionLen = 255
	// MaxGroupSize bounds the members of one all-reduce.
	MaxGroupSize = 1024
)

// ErrMessage reports a malformed or out-of-bounds message.
var ErrMessage = errors.New("averaging: malformed message")

var (
	magicReduce  = [4]byte{'S', 'K', 'A', 1}
	magicLeave   = [4]byte{'S', 'K', 'L', 1}
	magicDecline = [4]byte{'S', 'K', 'D', 1}
)

// reduceRequest is one chunk of a member's contribution to a reducer.
type reduceRequest struct {
	Session string
	Hash    uint64 // hash of the session's member list and weights
	Sender  uint16 // the sender's index in the member list
	Size    uint16 // the number of members
	Part    uint16 // the reducer's index (whose part the chunk is in)
	Chunk   uint32 // the chunk's index within the part
	Payload []byte // the chunk as a wire tensor encoding
}

const reduceHeader = 4 + 1 + 8 + 2 + 2 + 2 + 4

func (r *reduceRequest) marshal() []byte {
	b := r.appendHeader(make([]byte, 0, reduceHeader+len(r.Session)+len(r.Payload)))
	return append(b, r.Payload...)
}

// appendHeader appends everything but the payload.
func (r *reduceRequest) appendHeader(b []byte) []byte {
	b = append(b, magicReduce[:]...)
	b = append(b, byte(len(r.Session)))
	b = append(b, r.Session...)
	b = binary.LittleEndian.AppendUint64(b, r.Hash)
	b = binary.LittleEndian.AppendUint16(b, r.Sender)
	b = binary.LittleEndian.AppendUint16(b, r.Size)
	b = binary.LittleEndian.AppendUint16(b, r.Part)
	return binary.LittleEndian.AppendUint32(b, r.Chunk)
}

// unmarshalReduceRequest parses a request; Payload aliases b.
func unmarshalReduceRequest(b []byte) (reduceRequest, error) {
	var r reduceRequest
	if len(b) < reduceHeader || [4]byte(b[:4]) != magicReduce {
		return r, fmt.Errorf("%w: bad reduce header", ErrMessage)
	}
	n := int(b[4])
	if n == 0 || len(b) < reduceHeader+n {
		return r, fmt.Errorf("%w: bad session length", ErrMessage)
	}
	r.Session = string(b[5 : 5+n])
	p := b[5+n:]
	r.Hash = binary.LittleEndian.Uint64(p)
	r.Sender = binary.LittleEndian.Uint16(p[8:])
	r.Size = binary.LittleEndian.Uint16(p[10:])
	r.Part = binary.LittleEndian.Uint16(p[12:])
	r.Chunk = binary.LittleEndian.Uint32(p[14:])
	r.Payload = p[18:]
	if r.Size == 0 || r.Size > MaxGroupSize || r.Sender >= r.Size || r.Part >= r.Size {
		return r, fmt.Errorf("%w: member indices out of range", ErrMessage)
	}
	return r, nil
}

// marshalReduceResponse prefixes the averaged chunk with its contributor count.
func marshalReduceResponse(contributors int, payload []byte) []byte {
	b := make([]byte, 2, 2+len(payload))
	binary.LittleEndian.PutUint16(b, uint16(contributors))
	return append(b, payload...)
}

func unmarshalReduceResponse(b []byte, size int) (contributors int, payload []byte, err error) {
	if len(b) < 2 {
		return 0, nil, fmt.Errorf("%w: short reduce response", ErrMessage)
	}
	c := int(binary.LittleEndian.Uint16(b))
	if c < 1 || c > size {
		return 0, nil, fmt.Errorf("%w: %d contributors in a group of %d", ErrMessage, c, size)
	}
	return c, b[2:], nil
}

// leaveNotice says that the sender leaves a session, or, with Decline,
// that it declines to join it.
type leaveNotice struct {
	Session string
	Hash    uint64
	Decline bool
}

func (l leaveNotice) marshal() []byte {
	magic := magicLeave
	if l.Decline {
		magic = magicDecline
	}
	b := append([]byte(nil), magic[:]...)
	b = binary.LittleEndian.AppendUint64(b, l.Hash)
	return append(b, l.Session...)
}

func unmarshalLeave(b []byte) (leaveNotice, error) {
	if len(b) < 4+8+1 || len(b) > 4+8+MaxSessionLen {
		return leaveNotice{}, fmt.Errorf("%w: bad leave notice", ErrMessage)
	}
	m := [4]byte(b[:4])
	if m != magicLeave && m != magicDecline {
		return leaveNotice{}, fmt.Errorf("%w: bad leave notice", ErrMessage)
	}
	return leaveNotice{Hash: binary.LittleEndian.Uint64(b[4:]), Session: string(b[12:]), Decline: m == magicDecline}, nil
}
