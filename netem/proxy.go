package netem

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"
)

// Proxy is a loopback TCP forwarder that carries connections from peer From
// to a target address owned by peer To through the emulated links: bytes
// from the dialer travel From -> To, replies travel To -> From.
//
// To route a libp2p connection from A to B through emulated links, start
// n.Proxy(A, B, addrOfB) and give A the proxy's address for B (for example
// /ip4/127.0.0.1/tcp/<proxy port>/p2p/<B's ID>). The proxy is transparent to
// TLS and Noise, so B's identity is verified as usual.
type Proxy struct {
	n        *Network
	from, to peer.ID
	target   string
	ln       net.Listener
	ctx      context.Context
	cancel   context.CancelFunc
	wg       sync.WaitGroup

	mu    sync.Mutex
	conns map[net.Conn]struct{}
}

// Proxy starts a forwarder on 127.0.0.1 (a free port) to target, shaping
// traffic as the link from -> to and back. New connections are refused
// (accepted and closed at once) while from cannot reach to.
func (n *Network) Proxy(from, to peer.ID, target string) (*Proxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("netem: proxy listen: %w", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	p := &Proxy{
		n: n, from: from, to: to, target: target,
		ln: ln, ctx: ctx, cancel: cancel,
		conns: make(map[net.Conn]struct{}),
	}
	p.wg.Add(1)
	go p.accept()
	return p, nil
}

// Addr is the proxy's listening address, "127.0.0.1:port".
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// Close stops accepting, breaks the open connections and waits for the
// proxy's goroutines to exit.
func (p *Proxy) Close() error {
	p.cancel()
	err := p.ln.Close()
	p.mu.Lock()
	for c := range p.conns {
		c.Close()
	}
	p.mu.Unlock()
	p.wg.Wait()
	if errors.Is(err, net.ErrClosed) {
		err = nil
	}
	return err
}

func (p *Proxy) track(c net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.ctx.Err() != nil {
		return false
	}
	p.conns[c] = struct{}{}
	return true
}

func (p *Proxy) untrack(c net.Conn) {
	p.mu.Lock()
	defer p.mu.Unlock()
	delete(p.conns, c)
}

func (p *Proxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			if p.ctx.Err() != nil || errors.Is(err, net.ErrClosed) {
				return
			}
			// Temporary accept errors (e.g. EMFILE): back off briefly.
			select {
			case <-time.After(10 * time.Millisecond):
				continue
			case <-p.ctx.Done():
				return
			}
		}
		if !p.n.Reachable(p.from, p.to) || !p.track(c) {
			c.Close()
			continue
		}
		p.wg.Add(1)
		go p.serve(c)
	}
}

func (p *Proxy) serve(client net.Conn) {
	defer p.wg.Done()
	defer p.untrack(client)
	dctx, cancel := context.WithTimeout(p.ctx, 10*time.Second)
	var d net.Dialer
	target, err := d.DialContext(dctx, "tcp", p.target)
	cancel()
	if err != nil {
		client.Close()
		return
	}
	if !p.track(target) {
		client.Close()
		target.Close()
		return
	}
	defer p.untrack(target)
	up := p.n.Conn(target, p.from, p.to)   // client -> target
	down := p.n.Conn(client, p.to, p.from) // target -> client
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); pipe(up, client) }()
	go func() { defer wg.Done(); pipe(down, target) }()
	wg.Wait()
	up.Close()
	down.Close()
}

// pipe copies src to the shaped dst. At EOF it half-closes dst so the
// other side sees the end of the stream; on an error it breaks both.
func pipe(dst, src net.Conn) {
	buf := make([]byte, 32<<10)
	_, err := io.CopyBuffer(struct{ io.Writer }{dst}, struct{ io.Reader }{src}, buf)
	if err == nil {
		if hc, ok := dst.(interface{ CloseWrite() error }); ok {
			if hc.CloseWrite() == nil {
				return
			}
		}
	}
	dst.Close()
	src.Close()
}
