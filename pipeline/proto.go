package pipeline

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/core/protocol"
	ma "github.com/multiformats/go-multiaddr"

	"github.com/skyhive/skyhive/tensor"
	"github.com/skyhive/skyhive/wire"
)

// Protocol IDs. The coordinator serves register and ping; workers serve
// the rest. Activations and gradients travel worker to worker over acts
// (one stream per iteration and direction) or, on transports without
// streams, act (one call each).
const (
	ProtoRegister protocol.ID = "/skyhive/pipeline/register/1.0.0"
	ProtoPing     protocol.ID = "/skyhive/pipeline/ping/1.0.0"
	ProtoProfile  protocol.ID = "/skyhive/pipeline/profile/1.0.0"
	ProtoSetup    protocol.ID = "/skyhive/pipeline/setup/1.0.0"
	ProtoIter     protocol.ID = "/skyhive/pipeline/iter/1.0.0"
	ProtoCommit   protocol.ID = "/skyhive/pipeline/commit/1.0.0"
	ProtoAbort    protocol.ID = "/skyhive/pipeline/abort/1.0.0"
	ProtoFetch    protocol.ID = "/skyhive/pipeline/fetch/1.0.0"
	ProtoActs     protocol.ID = "/skyhive/pipeline/acts/1.0.0"
	// ProtoAct carries one activation per call, for transports without
	// streams (memnet).
	ProtoAct      protocol.ID = "/skyhive/pipeline/act/1.0.0"
	ProtoShutdown protocol.ID = "/skyhive/pipeline/shutdown/1.0.0"
	ProtoProbe    protocol.ID = "/skyhive/pipeline/probe/1.0.0"
)

// streamIdleTimeout bounds the silence on a worker's activation stream (a
// neighbour may compute for long between two messages).
const streamIdleTimeout = 10 * time.Minute

// Size bounds of what a peer accepts.
const (
	// DefaultMaxMessageBytes bounds one message of the coordinator's
	// calls (weights of a stage travel in one message).
	DefaultMaxMessageBytes = 512 << 20
	maxHeaderBytes         = 64 << 10
	maxAddrs               = 32
	maxMicro               = 1024
	maxBatch               = 1 << 16
	maxStages              = 1024
	maxLayers              = 4096
)

// bulkLimits bound the tensors of bulk messages (setup, fetch, iteration
// inputs); those of one activation follow from the stage's shapes (see
// inbox.limits).
var bulkLimits = wire.Limits{MaxElements: 1 << 27, MaxDims: 8, MaxTensors: 1 << 14}

// A message is a uint32 big-endian length, a JSON header of that length,
// and optionally a wire message of named tensors.
func encodeMsg(hdr any, ts []wire.Named) ([]byte, error) {
	h, err := json.Marshal(hdr)
	if err != nil {
		return nil, fmt.Errorf("pipeline: encode header: %w", err)
	}
	if len(h) > maxHeaderBytes {
		return nil, fmt.Errorf("pipeline: header of %d bytes over %d", len(h), maxHeaderBytes)
	}
	out := binary.BigEndian.AppendUint32(nil, uint32(len(h)))
	out = append(out, h...)
	if len(ts) > 0 {
		body, err := wire.MarshalMessage(ts, wire.Options{})
		if err != nil {
			return nil, fmt.Errorf("pipeline: encode tensors: %w", err)
		}
		out = append(out, body...)
	}
	return out, nil
}

var errMsg = errors.New("pipeline: malformed message")

// decodeMsg parses a message into hdr and returns its tensors.
func decodeMsg(b []byte, hdr any, lim wire.Limits) ([]wire.Named, error) {
	if len(b) < 4 {
		return nil, fmt.Errorf("%w: %d bytes", errMsg, len(b))
	}
	n := binary.BigEndian.Uint32(b)
	if n > maxHeaderBytes || uint64(n) > uint64(len(b)-4) {
		return nil, fmt.Errorf("%w: header length %d", errMsg, n)
	}
	if err := json.Unmarshal(b[4:4+n], hdr); err != nil {
		return nil, fmt.Errorf("%w: header: %w", errMsg, err)
	}
	rest := b[4+n:]
	if len(rest) == 0 {
		return nil, nil
	}
	ts, err := wire.UnmarshalMessage(rest, lim)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", errMsg, err)
	}
	return ts, nil
}

// decodeHeader parses a message that carries no tensors into hdr.
func decodeHeader(b []byte, hdr any) error {
	if len(b) < 4 {
		return fmt.Errorf("%w: %d bytes", errMsg, len(b))
	}
	if n := binary.BigEndian.Uint32(b); uint64(n) != uint64(len(b)-4) {
		return fmt.Errorf("%w: header of %d bytes in a message of %d", errMsg, n, len(b))
	}
	_, err := decodeMsg(b, hdr, wire.Limits{})
	return err
}

// namedMap turns tensors into a map (wire rejects duplicate names).
func namedMap(ts []wire.Named) map[string]*tensor.Tensor {
	m := make(map[string]*tensor.Tensor, len(ts))
	for _, t := range ts {
		m[t.Name] = t.Tensor
	}
	return m
}

// mapNamed turns a map into sorted named tensors.
func mapNamed(m map[string]*tensor.Tensor) []wire.Named {
	out := make([]wire.Named, 0, len(m))
	for k, v := range m {
		out = append(out, wire.Named{Name: k, Tensor: v})
	}
	slices.SortFunc(out, func(a, b wire.Named) int {
		switch {
		case a.Name < b.Name:
			return -1
		case a.Name > b.Name:
			return 1
		}
		return 0
	})
	return out
}

// PeerRef is a peer's identity and addresses in a JSON-friendly form.
type PeerRef struct {
	ID    string   `json:"id,omitempty"`
	Addrs []string `json:"addrs,omitempty"`
}

func refOf(ai peer.AddrInfo) PeerRef {
	r := PeerRef{}
	if ai.ID == "" {
		return r
	}
	r.ID = ai.ID.String()
	for _, a := range ai.Addrs {
		r.Addrs = append(r.Addrs, a.String())
	}
	return r
}

// addrInfo parses the reference; an empty reference gives a zero AddrInfo.
func (r PeerRef) addrInfo() (peer.AddrInfo, error) {
	if r.ID == "" {
		return peer.AddrInfo{}, nil
	}
	id, err := peer.Decode(r.ID)
	if err != nil {
		return peer.AddrInfo{}, fmt.Errorf("pipeline: peer id: %w", err)
	}
	if len(r.Addrs) > maxAddrs {
		return peer.AddrInfo{}, fmt.Errorf("pipeline: %d addresses, at most %d", len(r.Addrs), maxAddrs)
	}
	ai := peer.AddrInfo{ID: id}
	for _, s := range r.Addrs {
		a, err := ma.NewMultiaddr(s)
		if err != nil {
			return peer.AddrInfo{}, fmt.Errorf("pipeline: address %q: %w", s, err)
		}
		ai.Addrs = append(ai.Addrs, a)
	}
	return ai, nil
}

// registerReq is a worker joining the coordinator.
type registerReq struct {
	Name     string   `json:"name"`
	Addrs    []string `json:"addrs"`
	Slowdown float64  `json:"slowdown"`
	MemCap   int64    `json:"mem_cap"`
	Region   string   `json:"region,omitempty"`
}

type registerResp struct {
	Index int `json:"index"`
}

// profileReq asks a worker to time forward+backward of the whole model on
// a batch of the given size.
// Calibrate lists batch sizes at which the layers are also timed without
// the slowdown; Optim, if set, has one optimizer step timed.
type profileReq struct {
	Model     string      `json:"model"`
	Seed      uint64      `json:"seed"`
	Batch     int         `json:"batch"`
	Reps      int         `json:"reps"`
	Calibrate []int       `json:"calibrate,omitempty"`
	Optim     OptimConfig `json:"optim,omitzero"`
}

type profileResp struct {
	FLOPS   float64 `json:"flops"`   // FLOP/s at Batch, including the slowdown
	Seconds float64 `json:"seconds"` // median emulated time of one forward+backward
	CPU     float64 `json:"cpu"`     // median busy time (see opClock) of one forward+backward
	// Overshoot is how much later than its emulated time an op ends
	// (timer and scheduling delays), median over the passes.
	Overshoot float64 `json:"overshoot"`
	// Fwd[i][l] and Bwd[i][l] are layer l's forward and backward busy
	// seconds at batch size Calibrate[i].
	Fwd [][]float64 `json:"fwd,omitempty"`
	Bwd [][]float64 `json:"bwd,omitempty"`
	// OptimPerParam is the busy seconds of one optimizer step per
	// parameter.
	OptimPerParam float64 `json:"optim_per_param,omitempty"`
}

// setupReq assigns layers [First, Last) of Model to a worker as stage
// Stage of Stages in generation Gen. Stage < 0 releases the worker. The
// tensors are the stage's snapshot (prefixed names, see Snapshot).
type setupReq struct {
	Gen    uint64      `json:"gen"`
	Stage  int         `json:"stage"`
	Stages int         `json:"stages"`
	First  int         `json:"first"`
	Last   int         `json:"last"`
	Model  string      `json:"model"`
	Seed   uint64      `json:"seed"`
	Batch  int         `json:"batch"`
	Optim  OptimConfig `json:"optim"`
	Step   int64       `json:"step"`
	Iter   int         `json:"iter"` // iterations committed so far
	Prev   PeerRef     `json:"prev"`
	Next   PeerRef     `json:"next"`
	// Pin makes the worker reach its neighbours only at the addresses
	// given (emulated links).
	Pin bool `json:"pin,omitempty"`
}

// iterReq runs one iteration. Stage 0 gets the inputs ("x"), the last
// stage the labels ("y", float32).
type iterReq struct {
	Gen       uint64   `json:"gen"`
	Iter      int      `json:"iter"`
	Schedule  Schedule `json:"schedule"`
	Sizes     []int    `json:"sizes"` // micro-batch sizes
	TimeoutMS int64    `json:"timeout_ms"`
}

// iterResp reports a stage's iteration. Times are in seconds.
type iterResp struct {
	Compute float64 `json:"compute"`
	Comm    float64 `json:"comm"`
	Idle    float64 `json:"idle"`
	Wall    float64 `json:"wall"`
	CPU     float64 `json:"cpu"`     // busy time of the compute (see opClock; without the emulated slowdown; steady busy times with WorkerConfig.Steady)
	OpCV    float64 `json:"op_cv"`   // coefficient of variation of the compute times of ops of one kind (opSpread)
	Loss    float64 `json:"loss"`    // last stage: mean loss over the batch
	Correct int     `json:"correct"` // last stage: correct predictions (images, or tokens)
	GradSq  float64 `json:"grad_sq"` // squared L2 norm of the stage's gradients
}

// commitReq steps the optimizers after a successful iteration, with the
// gradients multiplied by Scale (global norm clipping).
type commitReq struct {
	Gen   uint64  `json:"gen"`
	Iter  int     `json:"iter"`
	LR    float64 `json:"lr"`
	Scale float64 `json:"scale"`
}

type commitResp struct {
	Seconds float64 `json:"seconds"`
}

type abortReq struct {
	Gen  uint64 `json:"gen"`
	Iter int    `json:"iter"`
}

type fetchReq struct {
	Gen uint64 `json:"gen"`
}

type fetchResp struct {
	Step int64 `json:"step"`
	Iter int   `json:"iter"`
}

// actMsg carries one micro-batch's activation (forward) or gradient
// (backward) in tensor "t".
type actMsg struct {
	Gen      uint64 `json:"gen"`
	Iter     int    `json:"iter"`
	Micro    int    `json:"micro"`
	Backward bool   `json:"backward"`
}

type empty struct{}
