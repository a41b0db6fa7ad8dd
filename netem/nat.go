package netem

import (
	"encoding/binary"
	"net/netip"
	"sync"
	"time"
)

// natFilter is the firewall of a home router in front of one peer: it
// accepts no inbound connections. A packet from outside reaches the peer
// only if it belongs to a flow the peer opened: same protocol, same remote
// address and port, same local port (endpoint-dependent filtering, the
// strictest common kind). Flows expire after natFlowTTL without outbound
// traffic. Hole punching works through it as through a real one: when both
// sides send at once, the inside side's packet opens the flow.
type natFilter struct {
	mu    sync.Mutex
	flows map[natFlow]time.Time // last outbound packet
}

// natFlowTTL is how long a flow stays open without outbound packets
// (Linux's conntrack keeps established TCP far longer and UDP for 30 s).
const natFlowTTL = 2 * time.Minute

// maxNATFlows bounds the table; the oldest flows go first when it is full.
const maxNATFlows = 1 << 16

type natFlow struct {
	proto           uint8
	inside, outside netip.AddrPort
}

func newNATFilter() *natFilter { return &natFilter{flows: make(map[natFlow]time.Time)} }

// parseFlow reads an IPv4 TCP or UDP packet's protocol, source and
// destination; ok is false for anything else (ICMP, fragments, runts).
func parseFlow(pkt []byte) (proto uint8, src, dst netip.AddrPort, ok bool) {
	if len(pkt) < 20 || pkt[0]>>4 != 4 {
		return 0, src, dst, false
	}
	ihl := int(pkt[0]&0x0f) * 4
	proto = pkt[9]
	fragOffset := binary.BigEndian.Uint16(pkt[6:8]) & 0x1fff
	if ihl < 20 || len(pkt) < ihl+4 || fragOffset != 0 || (proto != 6 && proto != 17) {
		return 0, src, dst, false
	}
	s := netip.AddrFrom4([4]byte(pkt[12:16]))
	d := netip.AddrFrom4([4]byte(pkt[16:20]))
	src = netip.AddrPortFrom(s, binary.BigEndian.Uint16(pkt[ihl:ihl+2]))
	dst = netip.AddrPortFrom(d, binary.BigEndian.Uint16(pkt[ihl+2:ihl+4]))
	return proto, src, dst, true
}

// outbound records a packet the inside peer sends.
func (f *natFilter) outbound(pkt []byte, now time.Time) {
	proto, src, dst, ok := parseFlow(pkt)
	if !ok {
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.flows) >= maxNATFlows {
		f.expire(now)
	}
	if len(f.flows) < maxNATFlows {
		f.flows[natFlow{proto, src, dst}] = now
	}
}

// inbound reports whether a packet from outside may reach the inside peer.
func (f *natFilter) inbound(pkt []byte, now time.Time) bool {
	proto, src, dst, ok := parseFlow(pkt)
	if !ok {
		return false
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	last, open := f.flows[natFlow{proto, dst, src}]
	return open && now.Sub(last) <= natFlowTTL
}

// expire drops the flows idle for longer than natFlowTTL; f.mu is held.
func (f *natFilter) expire(now time.Time) {
	for k, last := range f.flows {
		if now.Sub(last) > natFlowTTL {
			delete(f.flows, k)
		}
	}
}
