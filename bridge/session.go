package bridge

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"math"
	"net"

	"github.com/skyhive/skyhive/averaging/optimizer"
	"github.com/skyhive/skyhive/averaging/peer"
	"github.com/skyhive/skyhive/launch"
	"github.com/skyhive/skyhive/metrics"
	"github.com/skyhive/skyhive/nn"
	"github.com/skyhive/skyhive/node"
	"github.com/skyhive/skyhive/p2p"
	"github.com/skyhive/skyhive/tensor"
)

// session serves one client: hello, shm, join, then steps until close.
type session struct {
	conn *net.UnixConn
	cfg  Config

	specs  []ParamSpec
	total  int // elements of the parameters
	state  []ParamSpec
	extra  int // elements of the state buffers
	region *region
	inner  *remoteInner
	// sig is the model signature; init, if set, the twin's initial model.
	sig  string
	init *nn.Sequential
}

// trainingOptions are `skyhive peer`'s options for its own training loop,
// which a PyTorch client's loop owns: a client giving one is told so.
var trainingOptions = []string{
	"model", "seed", "batch", "lr", "momentum", "data_dir", "limit", "shard", "eval_examples",
	"data", "vocab", "seq", "corpus_bytes", "token_width", "eval_tokens", "warmup", "clip",
	"weight_decay", "steps", "duration", "eval_every", "slowdown", "checkpoint",
	"checkpoint_every", "stats", "stats_every", "json", "quiet",
}

// DecodeOptions returns the peer options a client gives (a JSON object of
// launch.Peer's fields) over `skyhive peer`'s defaults (peer.Defaults). It
// refuses unknown fields and those of the peer's own training loop.
func DecodeOptions(b []byte) (launch.Peer, error) {
	l := peer.Defaults()
	if len(bytes.TrimSpace(b)) == 0 || string(bytes.TrimSpace(b)) == "null" {
		return l, nil
	}
	var keys map[string]json.RawMessage
	if err := json.Unmarshal(b, &keys); err != nil {
		return l, fmt.Errorf("options: want a JSON object: %w", err)
	}
	for _, k := range trainingOptions {
		if _, ok := keys[k]; ok {
			return l, fmt.Errorf("option %q configures `skyhive peer`'s own training loop; with PyTorch, your loop and optimizer own it", k)
		}
	}
	d := json.NewDecoder(bytes.NewReader(b))
	d.DisallowUnknownFields()
	if err := d.Decode(&l); err != nil {
		return l, fmt.Errorf("options: %w (the options are `skyhive peer`'s, with _ for -)", err)
	}
	return l, nil
}

// Signature is the model signature of a client's parameters: peers of a
// run must share it.
func Signature(specs []ParamSpec, total int) string {
	h := fnv.New64a()
	for _, s := range specs {
		fmt.Fprintf(h, "%s %v;", s.Name, s.Shape)
	}
	return fmt.Sprintf("torch-%d-%016x", total, h.Sum64())
}

func (s *session) read() (Message, error) { return ReadMessage(s.conn) }

func (s *session) reply(m Message) error { return writeMessage(s.conn, m, nil) }

// fail tells the client what went wrong and returns err.
func (s *session) fail(kind string, err error) error {
	_ = s.reply(errorMessage(kind, err))
	return err
}

// run serves the session until the client closes it, the connection
// breaks or ctx ends (the connection is closed then).
func (s *session) run(ctx context.Context) error {
	defer s.conn.Close()
	stop := context.AfterFunc(ctx, func() { s.conn.Close() })
	defer stop()
	hello, err := s.read()
	if err != nil {
		return err
	}
	if hello.Op != OpHello {
		return s.fail(KindProtocol, fmt.Errorf("%w: first message %q, want %q", ErrProtocol, hello.Op, OpHello))
	}
	switch hello.Mode {
	case "", ModeAveraging:
	case ModeMoE:
		return s.runMoE(ctx, hello)
	default:
		return s.fail(KindConfig, fmt.Errorf("mode %q: want %q or %q", hello.Mode, ModeAveraging, ModeMoE))
	}
	l, pc, err := s.configure(hello)
	if err != nil {
		return s.fail(KindConfig, err)
	}
	elems := 2*s.total + s.extra
	if s.region, err = newRegion(elems); err != nil {
		return s.fail(KindConfig, err)
	}
	defer s.region.close()
	if s.init != nil {
		dst := s.region.floats(0, s.total)
		for _, p := range s.init.Params() {
			dst = dst[copy(dst, p.Value.Data):]
		}
	}
	fd := s.region.fd
	if err := writeMessage(s.conn, Message{Op: OpShm, Elements: elems, Bytes: 4 * elems, Init: s.init != nil}, &fd); err != nil {
		return err
	}
	join, err := s.read()
	if err != nil {
		return err
	}
	if join.Op != OpJoin {
		return s.fail(KindProtocol, fmt.Errorf("%w: got %q, want %q", ErrProtocol, join.Op, OpJoin))
	}
	s.inner = newRemoteInner(s.region, s.specs, s.total, s.state, s.innerStep)
	if err := s.checkFinite(false); err != nil {
		return s.fail(KindValue, err)
	}
	reg, stopMetrics, err := metrics.Start(ctx, l.Metrics, s.cfg.Log)
	if err != nil {
		return s.fail(KindConfig, launch.NewFieldError(err, "%s", "metrics"))
	}
	defer stopMetrics()
	if reg != nil {
		pc.Host.Metrics, pc.Metrics = reg.Registerer(), reg.Registerer()
	}
	pc.Log = s.cfg.Log
	peer.PublishStatus(&pc, l, s.cfg.Log)
	sig := s.sig
	m, err := peer.Attach(ctx, pc, s.inner, sig)
	if err != nil {
		kind := KindSwarm
		if errors.Is(err, peer.ErrConfig) || errors.Is(err, optimizer.ErrConfig) {
			kind = KindConfig
		}
		return s.fail(kind, err)
	}
	defer m.Close()
	logf(s.cfg.Log, "peer %s joined run %q (%s, %d parameters)", m.Node.ID(), pc.RunID, pc.Algo, s.total)
	if err := s.reply(Message{Op: OpJoined, Peer: m.Node.ID().String(), Addrs: addrs(m.Node.Host()), Model: sig,
		Donors: m.Joined, Round: m.Opt.Round(), OptStep: int(s.inner.steps)}); err != nil {
		return err
	}
	return s.serve(ctx, m)
}

// configure checks hello: the version, the parameters and the options.
func (s *session) configure(h Message) (launch.Peer, peer.Config, error) {
	if h.Version != Version {
		return launch.Peer{}, peer.Config{}, fmt.Errorf("the client speaks protocol version %d, this daemon %d: use the Python package and the skyhive binary of one release", h.Version, Version)
	}
	total, err := CheckParams(h.Params, s.cfg.MaxElements)
	if err != nil {
		return launch.Peer{}, peer.Config{}, err
	}
	s.specs, s.total = h.Params, total
	s.sig = Signature(s.specs, s.total)
	if h.Twin != nil {
		sig, model, err := h.Twin.check(s.specs, s.total)
		if err != nil {
			return launch.Peer{}, peer.Config{}, err
		}
		s.sig = sig
		if h.Twin.Init {
			s.init = model
		}
	}
	if len(h.State) > 0 {
		// At most three buffers per parameter element (Adam with AMSGrad).
		if s.extra, err = CheckParams(h.State, 3*total); err != nil {
			return launch.Peer{}, peer.Config{}, fmt.Errorf("optimizer state: %w", err)
		}
		s.state = h.State
	}
	l, err := DecodeOptions(h.Options)
	if err != nil {
		return l, peer.Config{}, err
	}
	if len(l.DHT) == 0 {
		return l, peer.Config{}, launch.NewFieldError(nil, "%s is required: the multiaddr of a `skyhive dht` node or of a peer of the swarm, ending in /p2p/PEER_ID", "dht")
	}
	host, err := node.HostConfig(l.Net)
	if err != nil {
		return l, peer.Config{}, err
	}
	pc, err := peer.FromLaunch(l, host)
	return l, pc, err
}

// serve answers step, status and close until the client closes.
func (s *session) serve(ctx context.Context, m *peer.Member) error {
	for {
		msg, err := s.read()
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
		switch msg.Op {
		case OpStep:
			if err := s.step(ctx, m, msg.Samples); err != nil {
				return err
			}
		case OpStatus:
			st, pr := m.Opt.Stats(), m.Opt.Progress()
			if err := s.reply(Message{Op: OpStatus, Peer: m.Node.ID().String(), Round: m.Opt.Round(), Stats: &st, Progress: &pr}); err != nil {
				return err
			}
		case OpClose:
			return s.reply(Message{Op: OpClosed})
		default:
			return s.fail(KindProtocol, fmt.Errorf("%w: got %q, want %q, %q or %q", ErrProtocol, msg.Op, OpStep, OpStatus, OpClose))
		}
	}
}

// step takes one step of the averaging optimizer on the region's
// gradients. A refused or failed step is reported and the session goes
// on; a broken connection ends it.
func (s *session) step(ctx context.Context, m *peer.Member, samples int) error {
	if samples < 0 || samples > 1<<30 {
		return s.reply(errorMessage(KindConfig, fmt.Errorf("a step of %d samples", samples)))
	}
	if err := s.checkFinite(true); err != nil {
		return s.reply(errorMessage(KindValue, err))
	}
	err := m.Opt.Step(ctx, samples)
	if cerr := s.inner.takeErr(); cerr != nil {
		return cerr
	}
	if err != nil {
		if ctx.Err() != nil {
			return nil
		}
		return s.reply(errorMessage(KindStep, err))
	}
	st, pr := m.Opt.Stats(), m.Opt.Progress()
	return s.reply(Message{Op: OpStepped, Round: m.Opt.Round(), Stats: &st, Progress: &pr})
}

// innerStep asks the client to step its optimizer on the region's
// gradients and waits until it has written the new parameters.
func (s *session) innerStep() error {
	if err := s.reply(Message{Op: OpInnerStep}); err != nil {
		return err
	}
	m, err := s.read()
	switch {
	case err != nil:
		return err
	case m.Op == OpError:
		return fmt.Errorf("the client's optimizer failed: %s", m.Error)
	case m.Op != OpInnerDone:
		return s.fail(KindProtocol, fmt.Errorf("%w: got %q, want %q", ErrProtocol, m.Op, OpInnerDone))
	}
	return nil
}

// checkFinite refuses parameters (and, if grads, gradients) holding NaN or
// infinity, naming the first tensor.
func (s *session) checkFinite(grads bool) error {
	for _, p := range s.inner.params {
		if i := nonFinite(p.Value.Data); i >= 0 {
			return fmt.Errorf("parameter %s holds NaN or infinity (element %d); the step was not taken: restore a checkpoint or lower the learning rate", p.Name, i)
		}
		if grads {
			if i := nonFinite(p.Grad.Data); i >= 0 {
				return fmt.Errorf("the gradient of %s holds NaN or infinity (element %d); the step was not taken: skip this batch (zero_grad) or lower the learning rate", p.Name, i)
			}
		}
	}
	return nil
}

// nonFinite returns the index of the first NaN or infinity in v, or -1:
// a sum of squares in float64 is finite exactly when every element is,
// and it is the fast pass (the scan runs only when it is not).
func nonFinite(v []float32) int {
	if s := tensor.SumSquares(v); !math.IsNaN(s) && !math.IsInf(s, 0) {
		return -1
	}
	return firstNonFinite(v)
}

// addrs lists where others reach h.
func addrs(h *p2p.Host) []string {
	ai := h.AddrInfo()
	var out []string
	for _, a := range ai.Addrs {
		out = append(out, fmt.Sprintf("%s/p2p/%s", a, ai.ID))
	}
	return out
}
