package admission

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/libp2p/go-libp2p/core/host"
	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
	ma "github.com/multiformats/go-multiaddr"
)

// Options are a Service's hooks into its host.
type Options struct {
	// Logger receives the service's events; nil discards them.
	Logger *slog.Logger
	// Warn logs a warning a remote peer provoked (a refused stranger);
	// the host passes its rate-limited logger. Nil: Logger.Warn.
	Warn func(msg string, args ...any)
}

// Service runs the admission handshake on a libp2p host: on every new
// outbound connection it proves this host's membership and checks the
// peer's, it answers the handshakes peers start, and it closes inbound
// connections whose peer is not admitted within Config.Timeout. A peer's
// admission is forgotten when its last connection closes. The methods
// are safe for concurrent use; Admitted is also safe on a nil Service,
// which stands for an open swarm.
type Service struct {
	h    host.Host
	cfg  Config
	log  *slog.Logger
	warn func(msg string, args ...any)

	ctx    context.Context // ends at Close
	cancel context.CancelFunc

	mu       sync.Mutex
	closed   bool
	running  sync.WaitGroup // handlers and handshakes
	admitted map[peer.ID]*admitState
}

// New checks cfg and this host's own token, then starts the protocol on h.
// The Service runs until Close.
func New(h host.Host, cfg Config, opts Options) (*Service, error) {
	if cfg.Timeout <= 0 {
		cfg.Timeout = DefaultTimeout
	}
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	if err := cfg.checkToken(h.ID(), time.Now()); err != nil {
		return nil, err
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	if opts.Warn == nil {
		opts.Warn = opts.Logger.Warn
	}
	ctx, cancel := context.WithCancel(context.Background())
	s := &Service{h: h, cfg: cfg, log: opts.Logger, warn: opts.Warn, ctx: ctx, cancel: cancel, admitted: map[peer.ID]*admitState{}}
	h.SetStreamHandler(Protocol, func(st network.Stream) {
		if !s.track() {
			st.Reset()
			return
		}
		defer s.running.Done()
		s.serve(st)
	})
	h.Network().Notify(&network.NotifyBundle{ConnectedF: s.connected, DisconnectedF: s.disconnected})
	return s, nil
}

// Close stops the service: handshakes in progress end, and Close waits
// for them and for the handlers. Close the host's connections first, so
// that handlers waiting for a peer return at once.
func (s *Service) Close() {
	s.mu.Lock()
	s.closed = true
	s.mu.Unlock()
	s.cancel()
	s.running.Wait()
}

// track registers a running handler or handshake; it reports false once
// the service closed.
func (s *Service) track() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return false
	}
	s.running.Add(1)
	return true
}

// admitState is a peer's admission: done is closed when the handshake
// ended; err is then its outcome.
type admitState struct {
	done    chan struct{}
	err     error
	expires time.Time // zero: never
}

// valid reports whether a finished handshake admitted the peer and the
// admission has not lapsed at now.
func (st *admitState) valid(now time.Time) bool {
	return st.err == nil && (st.expires.IsZero() || now.Before(st.expires))
}

// state returns p's admission state, nil if no handshake with p started.
func (s *Service) state(p peer.ID) *admitState {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.admitted[p]
}

// Admitted reports whether the peer has proven it belongs to the swarm
// (always true on a nil Service, an open swarm).
func (s *Service) Admitted(p peer.ID) bool {
	if s == nil {
		return true
	}
	st := s.state(p)
	if st == nil {
		return false
	}
	select {
	case <-st.done:
		return st.valid(time.Now())
	default:
		return false
	}
}

// Admit makes sure p and this host have admitted each other, running the
// handshake if no one has yet, and waiting for one in progress.
func (s *Service) Admit(ctx context.Context, p peer.ID) error {
	s.mu.Lock()
	st := s.admitted[p]
	mine := false
	if st != nil {
		select {
		case <-st.done:
			if !st.valid(time.Now()) {
				st = nil // failed or lapsed: try again
			}
		default:
		}
	}
	if st == nil {
		st = &admitState{done: make(chan struct{})}
		s.admitted[p] = st
		mine = true
	}
	s.mu.Unlock()
	if mine {
		st.expires, st.err = s.handshake(ctx, p)
		close(st.done)
	}
	select {
	case <-st.done:
		return st.err
	case <-ctx.Done():
		return fmt.Errorf("admission: handshake with %s: %w", p.ShortString(), ctx.Err())
	}
}

// Allow decides whether a stream from p may be served: p is admitted, or
// its handshake is running and admits it within the timeout. A peer that
// never started one is refused at once.
func (s *Service) Allow(p peer.ID) bool {
	st := s.state(p)
	if st == nil {
		return false
	}
	t := time.NewTimer(s.cfg.Timeout)
	defer t.Stop()
	select {
	case <-st.done:
	case <-t.C:
		return false
	case <-s.ctx.Done():
		return false
	}
	return st.valid(time.Now())
}

// waitAdmitted waits up to the timeout for p's handshake, which may still
// be running when p's first request arrives.
func (s *Service) waitAdmitted(p peer.ID) bool {
	if s.Admitted(p) {
		return true
	}
	ctx, cancel := context.WithTimeout(s.ctx, s.cfg.Timeout)
	defer cancel()
	return s.Admit(ctx, p) == nil
}

// handshake proves this host's membership to p and checks p's answer.
func (s *Service) handshake(ctx context.Context, p peer.ID) (time.Time, error) {
	a := s.cfg
	ctx, cancel := context.WithTimeout(ctx, a.Timeout)
	defer cancel()
	st, err := s.h.NewStream(network.WithAllowLimitedConn(ctx, "skyhive-admit"), p, Protocol)
	if err != nil {
		return time.Time{}, fmt.Errorf("%w by %s: %w", ErrNotAdmitted, p.ShortString(), err)
	}
	defer st.Close()
	stop := context.AfterFunc(ctx, func() { st.Reset() })
	defer stop()
	if dl, ok := ctx.Deadline(); ok {
		st.SetDeadline(dl)
	}
	if err := writeProof(st, a.proof(s.h.ID(), p)); err != nil {
		return time.Time{}, fmt.Errorf("%w by %s: send proof: %w", ErrNotAdmitted, p.ShortString(), err)
	}
	b, err := readProof(st)
	if err != nil {
		return time.Time{}, fmt.Errorf("%w by %s: read its proof: %w", ErrNotAdmitted, p.ShortString(), err)
	}
	exp, err := a.verify(b, p, s.h.ID(), time.Now())
	if err != nil {
		st.Reset()
		s.closePeer(p)
		return time.Time{}, fmt.Errorf("%w: %s: %w", ErrNotAdmitted, p.ShortString(), err)
	}
	return exp, nil
}

// serve answers a peer's handshake: it checks the peer's proof and
// answers with this host's, or with the reason of the refusal.
func (s *Service) serve(st network.Stream) {
	a := s.cfg
	p := st.Conn().RemotePeer()
	st.SetDeadline(time.Now().Add(a.Timeout))
	b, err := readProof(st)
	if err != nil {
		st.Reset()
		return
	}
	exp, verr := a.verify(b, p, s.h.ID(), time.Now())
	if verr != nil {
		s.warn("p2p: refused a peer that is not a member of the swarm", "peer", p, "err", verr)
		writeProof(st, append([]byte{proofRefuse}, "not a member of this swarm: "+verr.Error()...))
		st.Close()
		s.refuseLater(p)
		return
	}
	done := &admitState{done: make(chan struct{}), expires: exp}
	close(done.done)
	s.mu.Lock()
	if old := s.admitted[p]; old != nil {
		select {
		case <-old.done:
			s.admitted[p] = done
		default: // our own handshake with p is running; it will decide
		}
	} else {
		s.admitted[p] = done
	}
	s.mu.Unlock()
	if err := writeProof(st, a.proof(s.h.ID(), p)); err != nil {
		st.Reset()
		return
	}
	st.Close()
}

// refuseLater closes the connections to a refused peer once it had a
// moment to read why.
func (s *Service) refuseLater(p peer.ID) {
	time.AfterFunc(time.Second, func() {
		if s.ctx.Err() == nil {
			s.closePeer(p)
		}
	})
}

func (s *Service) closePeer(p peer.ID) {
	for _, c := range s.h.Network().ConnsToPeer(p) {
		c.Close()
	}
}

// connected runs the handshake on a new outbound connection, and closes
// an inbound one whose peer is not admitted in time.
func (s *Service) connected(_ network.Network, c network.Conn) {
	p := c.RemotePeer()
	if c.Stat().Direction == network.DirOutbound {
		if !s.track() {
			return
		}
		go func() {
			defer s.running.Done()
			if err := s.Admit(s.ctx, p); err != nil && s.ctx.Err() == nil {
				s.log.Warn("p2p: a peer did not admit this host", "peer", p, "err", err)
			}
		}()
		return
	}
	time.AfterFunc(s.cfg.Timeout, func() {
		if s.ctx.Err() == nil && !s.Admitted(p) && !c.IsClosed() {
			s.log.Debug("p2p: closing a connection without admission", "peer", p)
			c.Close()
		}
	})
}

// disconnected forgets a peer's finished admission when its last
// connection closes.
func (s *Service) disconnected(n network.Network, c network.Conn) {
	p := c.RemotePeer()
	if n.Connectedness(p) == network.Connected {
		return
	}
	s.mu.Lock()
	if st := s.admitted[p]; st != nil {
		select {
		case <-st.done:
			delete(s.admitted, p)
		default:
		}
	}
	s.mu.Unlock()
}

func writeProof(w io.Writer, b []byte) error {
	if len(b) > maxProofBytes {
		return errors.New("proof too long")
	}
	_, err := w.Write(append(binary.BigEndian.AppendUint16(nil, uint16(len(b))), b...))
	return err
}

func readProof(r io.Reader) ([]byte, error) {
	var hdr [2]byte
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		return nil, err
	}
	n := int(binary.BigEndian.Uint16(hdr[:]))
	if n > maxProofBytes {
		return nil, fmt.Errorf("proof of %d bytes over %d", n, maxProofBytes)
	}
	b := make([]byte, n)
	if _, err := io.ReadFull(r, b); err != nil {
		return nil, err
	}
	return b, nil
}

// RelayACL lets a relay serve only admitted peers. A relay service is
// configured before its host starts, so the ACL refuses everyone until
// Use hands it the host's Service.
type RelayACL struct{ s atomic.Pointer[Service] }

// Use makes s decide the ACL's answers.
func (a *RelayACL) Use(s *Service) { a.s.Store(s) }

// AllowReserve lets an admitted peer reserve a slot.
func (a *RelayACL) AllowReserve(p peer.ID, _ ma.Multiaddr) bool {
	s := a.s.Load()
	return s != nil && s.waitAdmitted(p)
}

// AllowConnect lets an admitted peer reach another admitted peer.
func (a *RelayACL) AllowConnect(src peer.ID, _ ma.Multiaddr, dest peer.ID) bool {
	s := a.s.Load()
	return s != nil && s.waitAdmitted(src) && s.Admitted(dest)
}
