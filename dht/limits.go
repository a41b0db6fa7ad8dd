// What a node knows about where its peers are, for the routing-table
// diversity limits and the storage quotas per address, and which keys it
// stores for.

package dht

import (
	"bytes"
	"net"

	kb "github.com/libp2p/go-libp2p-kbucket"
	"github.com/libp2p/go-libp2p/core/crypto"
	"github.com/libp2p/go-libp2p/core/host"
	"github.com/libp2p/go-libp2p/core/peer"
	ma "github.com/multiformats/go-multiaddr"
	manet "github.com/multiformats/go-multiaddr/net"
)

// addrGroup is where a peer is: its IP address and subnet (/24 for IPv4,
// /48 for IPv6; an IPv6 address counts as its /64, which one host usually
// owns). limited reports whether the node's per-address limits apply.
type addrGroup struct {
	ip, subnet string
	limited    bool
}

// remoteAddrser is implemented by transports (or test wrappers) that know
// the address a peer's connection comes from.
type remoteAddrser interface {
	RemoteAddrs(peer.ID) []ma.Multiaddr
}

// libp2pHost is implemented by p2p.Host.
type libp2pHost interface{ LibP2P() host.Host }

// observedAddrs returns the addresses of the transport's connections to
// p, which unlike announced addresses the peer cannot choose freely.
func (n *Node) observedAddrs(p peer.ID) []ma.Multiaddr {
	switch t := n.t.(type) {
	case remoteAddrser:
		return t.RemoteAddrs(p)
	case libp2pHost:
		var out []ma.Multiaddr
		for _, c := range t.LibP2P().Network().ConnsToPeer(p) {
			out = append(out, c.RemoteMultiaddr())
		}
		return out
	}
	return nil
}

// group places a peer by the first IP address among observed, else among
// announced.
func (n *Node) group(observed, announced []ma.Multiaddr) addrGroup {
	for _, set := range [2][]ma.Multiaddr{observed, announced} {
		for _, a := range set {
			ip, err := manet.ToIP(a)
			if err != nil {
				continue
			}
			return groupOf(ip, n.cfg.LimitPrivateAddrs)
		}
	}
	return addrGroup{}
}

func groupOf(ip net.IP, private bool) addrGroup {
	g := addrGroup{limited: private || !(ip.IsLoopback() || ip.IsPrivate() || ip.IsLinkLocalUnicast() || ip.IsUnspecified())}
	if v4 := ip.To4(); v4 != nil {
		g.ip = v4.String()
		g.subnet = v4.Mask(net.CIDRMask(24, 32)).String() + "/24"
		return g
	}
	g.ip = ip.Mask(net.CIDRMask(64, 128)).String() + "/64"
	g.subnet = ip.Mask(net.CIDRMask(48, 128)).String() + "/48"
	return g
}

// amongClosest reports whether this node is among the BucketSize (at
// least Replicas) nodes nearest to key that it knows of, i.e. one of the
// replicas a STORE for key should go to.
func (n *Node) amongClosest(key string) bool {
	k := max(n.cfg.BucketSize, n.cfg.Replicas)
	target := kb.ConvertKey(key)
	near := n.rt.NearestPeers(target, k)
	if len(near) < k {
		return true
	}
	self := kb.Xor(target, kb.ConvertPeerID(n.self))
	return bytes.Compare(self, kb.Xor(target, kb.ConvertPeerID(near[len(near)-1]))) < 0
}

// transportKey returns the transport's private key if it exposes it.
func transportKey(t any) crypto.PrivKey {
	switch t := t.(type) {
	case interface{ PrivKey() crypto.PrivKey }:
		return t.PrivKey()
	case libp2pHost:
		h := t.LibP2P()
		return h.Peerstore().PrivKey(h.ID())
	}
	return nil
}
