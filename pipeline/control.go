package pipeline

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"

	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/core/protocol"
)

// On a transport with streams (libp2p), the coordinator's calls to a
// worker travel over ProtoControl instead of their own request/response
// protocols: a request/response call is read whole by the host before any
// handler sees who sent it, while a stream handler can refuse a stranger
// before reading a byte. This lets the hosts bound plain calls to
// callBytes (heartbeats, link probes, registrations) and accept a stage's
// weights only from the coordinator.
//
// A control stream carries one call. Request: the protocol ID of the call
// (one length byte, then the ID), a uint32 big-endian length and the
// message. Response: a uint32 big-endian length and the reply; a handler's
// error ends the stream with an error frame.
const ProtoControl protocol.ID = "/skyhive/pipeline/control/1.0.0"

// callBytes bounds a plain request/response message on the hosts the
// coordinator and the workers start: a link probe's payload (at most
// 8 MiB, see measurePing) and a header.
const callBytes = 8<<20 + maxHeaderBytes

// bulkControl are the control calls whose requests carry tensors (a
// stage's weights, a batch); the others are a header only.
var bulkControl = map[protocol.ID]bool{ProtoSetup: true, ProtoIter: true}

// controlHandler answers one control call.
type controlHandler func(ctx context.Context, req []byte) ([]byte, error)

// onControl serves a control stream: only the coordinator the worker
// joined may call, and it is checked before anything is read.
func (w *Worker) onControl(ctx context.Context, from peer.ID, r io.Reader, wr io.Writer) error {
	if w.stopped() {
		return errStopped
	}
	if from != w.coord.ID {
		return fmt.Errorf("pipeline: %s accepts calls from the coordinator only", ProtoControl)
	}
	var l [1]byte
	if _, err := io.ReadFull(r, l[:]); err != nil {
		return fmt.Errorf("%w: control call: %w", errMsg, err)
	}
	name := make([]byte, l[0])
	if _, err := io.ReadFull(r, name); err != nil {
		return fmt.Errorf("%w: control call: %w", errMsg, err)
	}
	proto := protocol.ID(name)
	h := w.controls[proto]
	if h == nil {
		return fmt.Errorf("%w: unknown control call %q", errMsg, name)
	}
	limit := int64(4 + maxHeaderBytes)
	if bulkControl[proto] {
		limit = int64(w.cfg.MaxMessageBytes)
	}
	req, err := readMsg(r, limit)
	if err != nil {
		return fmt.Errorf("%s: %w", proto, err)
	}
	resp, err := h(ctx, req)
	if err != nil {
		return err
	}
	return writeMsg(wr, resp)
}

// readMsg reads a uint32 length and a message of at most limit bytes,
// growing its buffer as the bytes arrive.
func readMsg(r io.Reader, limit int64) ([]byte, error) {
	var hdr [4]byte
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		return nil, fmt.Errorf("%w: length: %w", errMsg, err)
	}
	n := binary.BigEndian.Uint32(hdr[:])
	if int64(n) > limit {
		return nil, fmt.Errorf("%w: message of %d bytes, at most %d", errMsg, n, limit)
	}
	return readFrame(r, int(n))
}

// writeMsg writes a uint32 length and the message.
func writeMsg(w io.Writer, b []byte) error {
	if uint64(len(b)) > 1<<32-1 {
		return fmt.Errorf("pipeline: message of %d bytes", len(b))
	}
	if _, err := w.Write(binary.BigEndian.AppendUint32(nil, uint32(len(b)))); err != nil {
		return err
	}
	_, err := w.Write(b)
	return err
}

// raw sends an encoded call to a worker and returns the raw reply: over
// ProtoControl when the transport has streams, as a plain call otherwise.
// Pings stay plain calls (workers answer them from anyone).
func (c *Coordinator) raw(ctx context.Context, to peer.AddrInfo, proto protocol.ID, b []byte) ([]byte, error) {
	st, ok := c.tr.(streamer)
	if !ok || proto == ProtoPing {
		return c.tr.Call(ctx, to, proto, b)
	}
	if len(proto) > 255 {
		return nil, errors.New("pipeline: protocol ID too long")
	}
	var out []byte
	err := st.CallStream(ctx, to, ProtoControl, func(w io.Writer) error {
		if _, err := w.Write(append([]byte{byte(len(proto))}, proto...)); err != nil {
			return err
		}
		return writeMsg(w, b)
	}, func(r io.Reader) error {
		var err error
		out, err = readMsg(r, int64(c.maxMsg))
		return err
	})
	return out, err
}
