package hostile

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"sync/atomic"

	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/core/protocol"

	"github.com/skyhive/skyhive/p2p"
	"github.com/skyhive/skyhive/pipeline"
	"github.com/skyhive/skyhive/wire"
)

// claimBytes is what the pipeline attacks claim a frame holds: the 512 MiB
// of issue 13's "exhausted worker".
const claimBytes = 512 << 20

// pipelineMsg encodes a pipeline message: a uint32 big-endian length, a
// JSON header of that length, and optionally a wire message of tensors.
func pipelineMsg(hdr any, ts ...wire.Named) []byte {
	h, err := json.Marshal(hdr)
	if err != nil {
		panic(fmt.Sprintf("hostile: pipeline header: %v", err))
	}
	b := binary.BigEndian.AppendUint32(nil, uint32(len(h)))
	b = append(b, h...)
	if len(ts) > 0 {
		m, err := wire.MarshalMessage(ts, wire.Options{})
		if err != nil {
			panic(fmt.Sprintf("hostile: pipeline tensors: %v", err))
		}
		b = append(b, m...)
	}
	return b
}

// streamAttack is an attack that opens a streamed call of proto and writes
// the bytes send makes through the chunk framing; the victim must end the
// call with an error.
func streamAttack(name string, to peer.AddrInfo, proto protocol.ID, bytes int, send func(w io.Writer) error) Attack {
	return Attack{Name: name, Bytes: bytes, Victim: to.ID, Send: func(ctx context.Context, h *p2p.Host) error {
		return h.CallStream(ctx, to, proto, send, func(r io.Reader) error {
			_, err := io.Copy(io.Discard, io.LimitReader(r, 1<<20))
			return err
		})
	}}
}

// controlCall writes a control call of ProtoControl: the call's protocol
// ID (one length byte, then the ID) and a message of claim bytes, of which
// only the first 64 KiB are sent.
func controlCall(call protocol.ID, claim uint32, body []byte) func(w io.Writer) error {
	return func(w io.Writer) error {
		b := append([]byte{byte(len(call))}, call...)
		b = binary.BigEndian.AppendUint32(b, claim)
		b = append(b, body...)
		_, err := w.Write(b)
		return err
	}
}

// PipelineWorkerAttacks are requests a pipeline worker must refuse from a
// peer that is not its coordinator or its neighbour stage: the
// coordinator's control calls (a stage's 512 MiB weights, an iteration,
// a shutdown), an activation stream whose first frame claims 512 MiB
// (the "exhausted worker" of issue 13), activations full of NaN and of the
// wrong shape, and a 4 GiB length prefix on a plain call.
func PipelineWorkerAttacks(to peer.AddrInfo) []Attack {
	nan := filledTensor(float32(math.NaN()), 64, 784)
	wrong := filledTensor(0.5, 64, 3)
	act := func(hdr any, ts ...wire.Named) func(w io.Writer) error {
		return func(w io.Writer) error {
			_, err := w.Write(pipelineMsg(hdr, ts...))
			return err
		}
	}
	junk := make([]byte, 64<<10)
	return []Attack{
		streamAttack("pipeline-setup-from-stranger", to, pipeline.ProtoControl, 64<<10,
			controlCall(pipeline.ProtoSetup, claimBytes, junk)),
		streamAttack("pipeline-iter-from-stranger", to, pipeline.ProtoControl, 256,
			controlCall(pipeline.ProtoIter, 128, pipelineMsg(map[string]any{"iter": 1}))),
		streamAttack("pipeline-shutdown-from-stranger", to, pipeline.ProtoControl, 64,
			controlCall(pipeline.ProtoShutdown, 2, []byte("{}"))),
		streamAttack("pipeline-acts-512MiB-frame", to, pipeline.ProtoActs, 64<<10, func(w io.Writer) error {
			b := binary.BigEndian.AppendUint32(nil, claimBytes)
			_, err := w.Write(append(b, junk...))
			return err
		}),
		streamAttack("pipeline-acts-nan", to, pipeline.ProtoActs, 4*64*784, act(map[string]any{"iter": 1, "micro": 0, "grad": false},
			wire.Named{Name: "x", Tensor: nan})),
		streamAttack("pipeline-acts-wrong-shape", to, pipeline.ProtoActs, 4*64*3, act(map[string]any{"iter": 1, "micro": 0, "grad": false},
			wire.Named{Name: "x", Tensor: wrong})),
		hugeLengthAttack(to, pipeline.ProtoPing),
	}
}

// PipelineCoordinatorAttacks are requests to a pipeline coordinator:
// registrations of fake workers from each identity, which it may absorb
// (one place per peer ID, at most pipeline.MaxWorkers, freed when the
// fake worker fails to be profiled), malformed registrations, and a 4 GiB
// length prefix.
func PipelineCoordinatorAttacks(to peer.AddrInfo) []Attack {
	var n atomic.Uint64
	return toVictim(to.ID, []Attack{
		{Name: "pipeline-register-fake-worker", Bytes: 256, Absorbed: true, Send: func(ctx context.Context, h *p2p.Host) error {
			var addrs []string
			for _, a := range h.AddrInfo().Addrs {
				addrs = append(addrs, a.String())
			}
			req := pipelineMsg(map[string]any{"name": fmt.Sprintf("hostile-%d", n.Add(1)), "addrs": addrs, "slowdown": 1e-9, "mem_cap": int64(1) << 50})
			_, err := h.Call(ctx, to, pipeline.ProtoRegister, req)
			return err
		}},
		callAttack("pipeline-register-malformed", to, pipeline.ProtoRegister, []byte("\x00\x00\x00\x09{garbage}")),
		hugeLengthAttack(to, pipeline.ProtoRegister),
	})
}
