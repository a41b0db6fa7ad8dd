// Package dialback asks a peer to dial the caller's addresses back over
// a fresh connection and say what it saw: the reachability check of
// `skyhive doctor`. Serve registers the protocol on a host; Ask calls it.
package dialback

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"strings"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/core/protocol"
	ma "github.com/multiformats/go-multiaddr"
	manet "github.com/multiformats/go-multiaddr/net"

	"github.com/skyhive/skyhive/p2p"
)

// Protocol asks a peer to dial the caller's addresses back over a fresh
// connection and say what it saw.
const Protocol protocol.ID = "/skyhive/dialback/1.0.0"

// Dial-back limits: a request names at most MaxAddrs addresses, all on
// the caller's own IP (so the service cannot be aimed at third parties),
// each tried for at most Timeout, one request at a time.
const (
	MaxAddrs    = 8
	Timeout     = 5 * time.Second
	maxReqBytes = 4 << 10
)

// Result is what the dialling peer saw for one address.
type Result struct {
	Addr string `json:"addr"`
	OK   bool   `json:"ok"`
	// Error says why the dial failed, or why the address was not tried.
	Error string `json:"error,omitempty"`
	// Millis is the time to connect.
	Millis float64 `json:"ms,omitempty"`
}

type request struct {
	Addrs []string `json:"addrs"`
}

// Serve answers Protocol on h: for each requested address on the
// caller's IP it opens a new TCP connection (QUIC and relayed addresses
// are reported as not checked) and reports whether it succeeded.
func Serve(h *p2p.Host) {
	sem := make(chan struct{}, 1)
	h.SetHandler(Protocol, func(ctx context.Context, from peer.ID, req []byte) ([]byte, error) {
		select {
		case sem <- struct{}{}:
			defer func() { <-sem }()
		default:
			return nil, errors.New("busy: another dial-back is running, retry later")
		}
		r, err := parseRequest(req)
		if err != nil {
			return nil, err
		}
		var seen []net.IP
		for _, c := range h.LibP2P().Network().ConnsToPeer(from) {
			if ip, err := manet.ToIP(c.RemoteMultiaddr()); err == nil {
				seen = append(seen, ip)
			}
		}
		out := make([]Result, 0, len(r.Addrs))
		for _, s := range r.Addrs {
			out = append(out, dialBack(ctx, s, seen))
		}
		return json.Marshal(out)
	})
}

// parseRequest decodes and bounds a request from the network.
func parseRequest(req []byte) (request, error) {
	var r request
	if len(req) > maxReqBytes {
		return r, p2p.ErrTooLarge
	}
	if err := json.Unmarshal(req, &r); err != nil {
		return r, fmt.Errorf("bad dial-back request: %w", err)
	}
	if len(r.Addrs) > MaxAddrs {
		return r, fmt.Errorf("%d addresses, at most %d", len(r.Addrs), MaxAddrs)
	}
	return r, nil
}

// dialBack tries one address if it is a TCP address on one of the
// caller's IPs.
func dialBack(ctx context.Context, s string, callerIPs []net.IP) Result {
	res := Result{Addr: s}
	a, err := ma.NewMultiaddr(s)
	if err != nil {
		res.Error = "not a multiaddr"
		return res
	}
	if strings.Contains(a.String(), "/p2p-circuit") {
		res.Error = "relayed: not checked"
		return res
	}
	a, _ = ma.SplitFunc(a, func(c ma.Component) bool { return c.Protocol().Code == ma.P_P2P })
	network, host, err := manet.DialArgs(a)
	if err != nil || (network != "tcp" && network != "tcp4" && network != "tcp6") {
		res.Error = "not a TCP address: not checked"
		return res
	}
	ip, err := manet.ToIP(a)
	if err != nil || !containsIP(callerIPs, ip) {
		res.Error = "not the address the request came from: refused"
		return res
	}
	dctx, cancel := context.WithTimeout(ctx, Timeout)
	defer cancel()
	start := time.Now()
	conn, err := (&net.Dialer{}).DialContext(dctx, network, host)
	if err != nil {
		res.Error = err.Error()
		return res
	}
	conn.Close()
	res.OK = true
	res.Millis = float64(time.Since(start).Microseconds()) / 1e3
	return res
}

func containsIP(ips []net.IP, ip net.IP) bool {
	for _, x := range ips {
		if x.Equal(ip) {
			return true
		}
	}
	return false
}

// Ask asks the peer to dial addrs back and returns what it saw.
func Ask(ctx context.Context, t p2p.Transport, to peer.AddrInfo, addrs []string) ([]Result, error) {
	req, err := json.Marshal(request{Addrs: addrs})
	if err != nil {
		return nil, err
	}
	resp, err := t.Call(ctx, to, Protocol, req)
	if err != nil {
		return nil, err
	}
	var out []Result
	if err := json.Unmarshal(resp, &out); err != nil {
		return nil, fmt.Errorf("dialback: answer from %s: %w", to.ID.ShortString(), err)
	}
	if len(out) > len(addrs) {
		return nil, fmt.Errorf("dialback: answer from %s has %d results for %d addresses", to.ID.ShortString(), len(out), len(addrs))
	}
	return out, nil
}
