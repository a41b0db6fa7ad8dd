package bridge

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"regexp"

	"github.com/skyhive/skyhive/averaging/optimizer"
)

// Version is the protocol version this daemon speaks; a client sends the
// one it speaks in hello and is refused if they differ.
const Version = 1

// Bounds on what a client may send, checked before anything is allocated.
const (
	// MaxMessageBytes bounds one control message.
	MaxMessageBytes = 1 << 20
	// MaxParams bounds the number of parameter tensors.
	MaxParams = 1 << 14
	// MaxDims bounds the dimensions of one tensor.
	MaxDims = 8
	// MaxNameBytes bounds a parameter's name.
	MaxNameBytes = 256
)

// Operations of the protocol.
const (
	OpHello     = "hello"
	OpShm       = "shm"
	OpJoin      = "join"
	OpJoined    = "joined"
	OpStep      = "step"
	OpInnerStep = "inner_step"
	OpInnerDone = "inner_done"
	OpStepped   = "stepped"
	OpStatus    = "status"
	OpClose     = "close"
	OpClosed    = "closed"
	OpError     = "error"
)

// Error kinds of an OpError reply, for the client to raise the right
// exception.
const (
	// KindProtocol: the message was malformed or out of order; the
	// session ends.
	KindProtocol = "protocol"
	// KindConfig: an option, the version or the parameters' description
	// was refused.
	KindConfig = "config"
	// KindSwarm: joining the run failed (DHT, not enough peers, another
	// model).
	KindSwarm = "swarm"
	// KindValue: a parameter or gradient holds NaN or infinity; the step
	// was not taken and the session goes on.
	KindValue = "value"
	// KindStep: the averaging step failed; the session goes on.
	KindStep = "step"
)

// ParamSpec describes one parameter tensor: its name and shape. Every
// tensor crosses in float32 (the client converts fp16 and bf16).
type ParamSpec struct {
	Name  string `json:"name"`
	Shape []int  `json:"shape"`
}

// Message is one control message; Op says which fields apply.
type Message struct {
	Op string `json:"op"`

	// hello: the parameters, the client optimizer's state buffers (e.g.
	// "0.weight.exp_avg"), which the daemon serves to peers joining late
	// and fills from the swarm when this peer joins late, and the options.
	Version int             `json:"version,omitempty"`
	Params  []ParamSpec     `json:"params,omitempty"`
	State   []ParamSpec     `json:"state,omitempty"`
	Options json.RawMessage `json:"options,omitempty"`
	// Twin, in hello, says the model is the PyTorch twin of a registry
	// model; in shm, Init says the parameters hold its initial weights.
	Twin *Twin `json:"twin,omitempty"`
	Init bool  `json:"init,omitempty"`
	// step: the examples the gradients were computed on.
	Samples int `json:"samples,omitempty"`

	// shm: the region's float32 elements (parameters, gradients, then
	// the state buffers) and bytes.
	Elements int `json:"elements,omitempty"`
	Bytes    int `json:"bytes,omitempty"`
	// joined: the optimizer's step counter of the state downloaded.
	OptStep int `json:"opt_step,omitempty"`
	// joined, stepped, status
	Peer     string              `json:"peer,omitempty"`
	Addrs    []string            `json:"addrs,omitempty"`
	Model    string              `json:"model,omitempty"`
	Donors   int                 `json:"donors,omitempty"`
	Round    int                 `json:"round,omitempty"`
	Stats    *optimizer.Stats    `json:"stats,omitempty"`
	Progress *optimizer.Progress `json:"progress,omitempty"`
	// hello: the session's mode (ModeAveraging when empty, ModeMoE) and
	// a MoE session's options.
	Mode string      `json:"mode,omitempty"`
	MoE  *MoEOptions `json:"moe,omitempty"`
	// moe_forward, moe_dx: the input's shape. moe_forward: Keep the pass
	// for a backward pass; moe_out: the kept pass's Call (0: not kept),
	// each sample's candidates' grid coordinates, best first, and whether
	// each answered. moe_backward, moe_release: the pass's Call.
	Shape    []int     `json:"shape,omitempty"`
	Keep     bool      `json:"keep,omitempty"`
	Call     int       `json:"call,omitempty"`
	Coords   [][][]int `json:"coords,omitempty"`
	Answered [][]bool  `json:"answered,omitempty"`
	// error
	Kind  string `json:"kind,omitempty"`
	Error string `json:"error,omitempty"`
}

// ErrProtocol wraps a malformed message or one out of order.
var ErrProtocol = errors.New("bridge: protocol error")

// ReadMessage reads one framed message, refusing one over MaxMessageBytes
// before reading it.
func ReadMessage(r io.Reader) (Message, error) {
	b, err := readFrame(r)
	if err != nil {
		return Message{}, err
	}
	return DecodeMessage(b)
}

// readFrame reads one frame's body, refusing one over MaxMessageBytes
// before reading it.
func readFrame(r io.Reader) ([]byte, error) {
	var hdr [4]byte
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		return nil, err
	}
	n := binary.BigEndian.Uint32(hdr[:])
	if n == 0 || n > MaxMessageBytes {
		return nil, fmt.Errorf("%w: message of %d bytes (at most %d)", ErrProtocol, n, MaxMessageBytes)
	}
	b := make([]byte, n)
	if _, err := io.ReadFull(r, b); err != nil {
		return nil, err
	}
	return b, nil
}

// DecodeMessage decodes one message body.
func DecodeMessage(b []byte) (Message, error) {
	var m Message
	if err := json.Unmarshal(b, &m); err != nil {
		return Message{}, fmt.Errorf("%w: %w", ErrProtocol, err)
	}
	if m.Op == "" {
		return Message{}, fmt.Errorf("%w: message without an op", ErrProtocol)
	}
	return m, nil
}

// EncodeMessage frames m.
func EncodeMessage(m Message) ([]byte, error) { return encodeFrame(m) }

// encodeFrame frames the JSON encoding of v.
func encodeFrame(v any) ([]byte, error) {
	b, err := json.Marshal(v)
	if err != nil {
		return nil, err
	}
	if len(b) > MaxMessageBytes {
		return nil, fmt.Errorf("%w: message of %d bytes", ErrProtocol, len(b))
	}
	out := make([]byte, 4, 4+len(b))
	binary.BigEndian.PutUint32(out, uint32(len(b)))
	return append(out, b...), nil
}

// validName is what a parameter's name may hold (PyTorch's dotted names).
var validName = regexp.MustCompile(`^[A-Za-z0-9_.:/\-]+$`)

// CheckParams checks a model's description and returns its total number
// of elements: 1..MaxParams tensors with distinct, printable names and
// 0..MaxDims positive dimensions, at most maxElements elements in all
// (counted without overflow).
func CheckParams(ps []ParamSpec, maxElements int) (int, error) {
	if len(ps) == 0 || len(ps) > MaxParams {
		return 0, fmt.Errorf("%d parameter tensors, want 1 to %d", len(ps), MaxParams)
	}
	seen := make(map[string]bool, len(ps))
	total := 0
	for i, p := range ps {
		if len(p.Name) == 0 || len(p.Name) > MaxNameBytes || !validName.MatchString(p.Name) {
			return 0, fmt.Errorf("parameter %d: name %.40q: want 1 to %d letters, digits and _.:/-", i, p.Name, MaxNameBytes)
		}
		if seen[p.Name] {
			return 0, fmt.Errorf("parameter %q appears twice", p.Name)
		}
		seen[p.Name] = true
		if len(p.Shape) > MaxDims {
			return 0, fmt.Errorf("parameter %q has %d dimensions, at most %d", p.Name, len(p.Shape), MaxDims)
		}
		n := 1
		for _, d := range p.Shape {
			if d < 1 || d > maxElements || n > maxElements/d {
				return 0, fmt.Errorf("parameter %q: shape %v: every dimension positive, at most %d elements", p.Name, p.Shape, maxElements)
			}
			n *= d
		}
		if total > maxElements-n {
			return 0, fmt.Errorf("the model has more than %d elements, the most one run averages", maxElements)
		}
		total += n
	}
	return total, nil
}

// firstNonFinite returns the index of the first NaN or infinity in v, or -1.
func firstNonFinite(v []float32) int {
	for i, x := range v {
		if x-x != 0 { // NaN and ±Inf, without a conversion per element
			return i
		}
	}
	return -1
}
