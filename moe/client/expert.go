// Package client calls Learning@home experts hosted by moe/server:
// RemoteExpert runs one expert over RPC, BeamSearch finds the best live
// experts of a grid through the DHT's prefix records, and MixtureOfExperts is
// a layer that gates each sample to its top-k experts, calls them in
// parallel with timeouts and combines the answers of those that replied.
package client

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"

	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/core/protocol"

	"github.com/skyhive/skyhive/moe"
	"github.com/skyhive/skyhive/nn"
	"github.com/skyhive/skyhive/p2p"
	"github.com/skyhive/skyhive/tensor"
	"github.com/skyhive/skyhive/wire"
)

// RemoteExpert is one expert on a server. Its Forward and Backward are
// RPCs; Backward sends the input with the output gradient, and the server
// recomputes the forward pass, applies its optimizer and returns the input
// gradient, so the expert holds no parameters on this side.
type RemoteExpert struct {
	UID       string
	Peer      peer.AddrInfo
	Transport p2p.Transport
	// Codec encodes the tensors sent (CodecNone).
	Codec wire.Codec
	// Limits bound the decoded responses (wire defaults).
	Limits wire.Limits
}

// ExpertError is an error of one expert call, naming the expert.
type ExpertError struct {
	UID  string
	Peer peer.ID
	Op   string
	Err  error
}

func (e *ExpertError) Error() string {
	return fmt.Sprintf("expert %s on %s: %s: %v", e.UID, e.Peer.ShortString(), e.Op, e.Err)
}

func (e *ExpertError) Unwrap() error { return e.Err }

func (r *RemoteExpert) call(ctx context.Context, op string, proto protocol.ID, msg []wire.Named, want string, shape []int) (*tensor.Tensor, error) {
	fail := func(err error) (*tensor.Tensor, error) {
		return nil, &ExpertError{UID: r.UID, Peer: r.Peer.ID, Op: op, Err: err}
	}
	req, err := moe.EncodeRequest(r.UID, msg, wire.Options{Codec: r.Codec})
	if err != nil {
		return fail(err)
	}
	resp, err := r.Transport.Call(ctx, r.Peer, proto, req)
	if err != nil {
		return fail(err)
	}
	lim := r.Limits
	if lim.MaxElements <= 0 {
		lim.MaxElements = tensor.NumElements(shape)
	}
	out, err := wire.UnmarshalMessage(resp, lim)
	if err != nil {
		return fail(err)
	}
	t := wire.Get(out, want)
	if t == nil || !slices.Equal(t.Shape, shape) {
		return fail(fmt.Errorf("%w: response lacks %q of shape %v", moe.ErrRequest, want, shape))
	}
	return t, nil
}

// Forward runs the expert on x and returns its output, which has x's shape.
// The state it returns (x itself) is what Backward needs.
func (r *RemoteExpert) Forward(ctx context.Context, x *tensor.Tensor) (*tensor.Tensor, nn.State, error) {
	y, err := r.call(ctx, "forward", moe.ForwardProtocol, []wire.Named{{Name: "x", Tensor: x}}, "y", x.Shape)
	if err != nil {
		return nil, nil, err
	}
	return y, x, nil
}

// Backward sends the input of a Forward call and the gradient dy of the
// loss with respect to its output; the server updates the expert and
// answers with the gradient with respect to the input.
func (r *RemoteExpert) Backward(ctx context.Context, st nn.State, dy *tensor.Tensor) (*tensor.Tensor, error) {
	x, ok := st.(*tensor.Tensor)
	if !ok || x == nil {
		return nil, &ExpertError{UID: r.UID, Peer: r.Peer.ID, Op: "backward", Err: fmt.Errorf("state is not from Forward")}
	}
	return r.call(ctx, "backward", moe.BackwardProtocol, []wire.Named{{Name: "x", Tensor: x}, {Name: "dy", Tensor: dy}}, "dx", x.Shape)
}

// Params returns nil: a remote expert's parameters live on its server.
func (r *RemoteExpert) Params() []*nn.Param { return nil }

// Info asks the server for the expert's description.
func (r *RemoteExpert) Info(ctx context.Context) (moe.Spec, error) {
	req, err := moe.EncodeRequest(r.UID, nil, wire.Options{})
	if err != nil {
		return moe.Spec{}, err
	}
	resp, err := r.Transport.Call(ctx, r.Peer, moe.InfoProtocol, req)
	if err != nil {
		return moe.Spec{}, &ExpertError{UID: r.UID, Peer: r.Peer.ID, Op: "info", Err: err}
	}
	var s moe.Spec
	if len(resp) > moe.MaxInfoLen {
		return s, &ExpertError{UID: r.UID, Peer: r.Peer.ID, Op: "info", Err: fmt.Errorf("answer of %d bytes", len(resp))}
	}
	if err := json.Unmarshal(resp, &s); err != nil {
		return s, &ExpertError{UID: r.UID, Peer: r.Peer.ID, Op: "info", Err: err}
	}
	return s, nil
}
