package optimizer

import (
	"encoding/binary"
	"fmt"
	"math"

	"github.com/skyhive/skyhive/averaging"
)

// Protocols spoken by an Optimizer.
const (
	// ActivateProtocol carries WAGMA's activation of a group or global round.
	ActivateProtocol = "/skyhive/averaging/activate/1.0.0"
	// StateProtocol serves a peer's model and optimizer state to a peer
	// joining late.
	StateProtocol = "/skyhive/averaging/state/2.0.0"
)

var (
	magicActivate = [4]byte{'S', 'K', 'W', 1}
	magicState    = [4]byte{'S', 'K', 'S', 2}
)

// Activation kinds.
const (
	activateGroup  = 1
	activateGlobal = 2
)

// activation tells a member that a WAGMA round has started.
type activation struct {
	Kind  uint8
	Round uint64
	Hash  uint64 // member-list hash of the activator's session
}

func (a activation) marshal() []byte {
	b := append([]byte(nil), magicActivate[:]...)
	b = append(b, a.Kind)
	b = binary.LittleEndian.AppendUint64(b, a.Round)
	return binary.LittleEndian.AppendUint64(b, a.Hash)
}

func unmarshalActivation(b []byte) (activation, error) {
	if len(b) != 4+1+8+8 || [4]byte(b[:4]) != magicActivate {
		return activation{}, fmt.Errorf("%w: bad activation", averaging.ErrMessage)
	}
	a := activation{Kind: b[4], Round: binary.LittleEndian.Uint64(b[5:]), Hash: binary.LittleEndian.Uint64(b[13:])}
	if a.Kind != activateGroup && a.Kind != activateGlobal {
		return activation{}, fmt.Errorf("%w: activation kind %d", averaging.ErrMessage, a.Kind)
	}
	if a.Round > math.MaxInt32 {
		return activation{}, fmt.Errorf("%w: round %d out of range", averaging.ErrMessage, a.Round)
	}
	return a, nil
}

// stateRequest asks for Count elements of a donor's state from Offset. A
// request at offset 0 makes the donor take a fresh snapshot for the
// requester, which later requests read from, so the download is consistent.
type stateRequest struct {
	Offset uint64
	Count  uint32
}

func (s stateRequest) marshal() []byte {
	b := append([]byte(nil), magicState[:]...)
	b = binary.LittleEndian.AppendUint64(b, s.Offset)
	return binary.LittleEndian.AppendUint32(b, s.Count)
}

func unmarshalStateRequest(b []byte) (stateRequest, error) {
	if len(b) != 16 || [4]byte(b[:4]) != magicState {
		return stateRequest{}, fmt.Errorf("%w: bad state request", averaging.ErrMessage)
	}
	return stateRequest{Offset: binary.LittleEndian.Uint64(b[4:]), Count: binary.LittleEndian.Uint32(b[12:])}, nil
}

// stateHeader describes the donor's snapshot; it precedes every chunk.
type stateHeader struct {
	Layout  uint64 // Layout.Hash
	Total   uint64 // elements: model, then optimizer buffers
	Round   uint64
	OptStep uint64
	Epoch   uint64
}

const stateHeaderLen = 5 * 8

func marshalStateResponse(h stateHeader, payload []byte) []byte {
	b := make([]byte, 0, stateHeaderLen+len(payload))
	for _, v := range []uint64{h.Layout, h.Total, h.Round, h.OptStep, h.Epoch} {
		b = binary.LittleEndian.AppendUint64(b, v)
	}
	return append(b, payload...)
}

func unmarshalStateResponse(b []byte) (stateHeader, []byte, error) {
	if len(b) < stateHeaderLen {
		return stateHeader{}, nil, fmt.Errorf("%w: short state response", averaging.ErrMessage)
	}
	var v [5]uint64
	for i := range v {
		v[i] = binary.LittleEndian.Uint64(b[8*i:])
	}
	h := stateHeader{Layout: v[0], Total: v[1], Round: v[2], OptStep: v[3], Epoch: v[4]}
	if h.Round > math.MaxInt32 || h.OptStep > math.MaxInt32 || h.Epoch > math.MaxInt32 {
		return stateHeader{}, nil, fmt.Errorf("%w: state counters out of range", averaging.ErrMessage)
	}
	return h, b[stateHeaderLen:], nil
}
