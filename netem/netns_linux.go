//go:build linux

package netem

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"
	"golang.org/x/sys/unix"
)

// TopologyOptions tunes NewTopology. Zero fields take the defaults.
type TopologyOptions struct {
	// Prefix starts every namespace name (default "skyhive"). Names are
	// Prefix-PID-INDEX, so concurrent runs do not collide and namespaces
	// left behind by a dead process can be recognised and removed.
	Prefix string
	// Subnet holds the peers' addresses: peer i gets the (i+1)-th address
	// (default 10.77.0.0/24, room for 254 peers).
	Subnet netip.Prefix
	// MTU of each peer's interface (default 1500).
	MTU int
	// QueueDelay bounds each link's queue: a packet that would wait longer
	// than this for the link is dropped, as a router's tail drop (default
	// 200 ms, at least one bandwidth-delay product for RTTs up to 200 ms).
	QueueDelay time.Duration
	// NAT lists peers behind a NAT that accepts no inbound connections:
	// packets reach them only on flows they opened (natFilter). They join
	// a swarm through a relay, or by hole punching.
	NAT []peer.ID
}

// TopologyStats counts the router's packets.
type TopologyStats struct {
	Forwarded   uint64 `json:"forwarded"`
	Lost        uint64 `json:"lost"`        // dropped by the loss model
	QueueDrops  uint64 `json:"queue_drops"` // tail drops
	Unreachable uint64 `json:"unreachable"` // partitions, blocks, crashes
	NATDrops    uint64 `json:"nat_drops"`   // inbound packets a NAT refused
	Other       uint64 `json:"other"`       // not IPv4 or unknown destination
}

// Topology is mode 2 of netem: one Linux network namespace per peer, each
// with a TUN interface whose file descriptor is held by this process. A
// user-space router reads every IP packet a peer's kernel sends, schedules
// it on the emulated link to the destination peer (bandwidth queue, delay,
// jitter, loss, partitions) and writes it into the destination's TUN at its
// arrival time. Real kernel TCP therefore runs end to end over the emulated
// links. Requires root, the ip command and /dev/net/tun.
type Topology struct {
	n      *Network
	opts   TopologyOptions
	ids    []peer.ID
	ns     []string
	addrs  []netip.Addr
	index  map[netip.Addr]int
	byID   map[peer.ID]int
	tuns   []*os.File
	quit   chan struct{}
	wg     sync.WaitGroup
	stopFn func() bool

	linkMu sync.Mutex
	links  map[[2]int]chan routedPacket

	nat []*natFilter // per peer; nil if not behind a NAT

	closeOnce sync.Once
	closeErr  error

	forwarded, lost, queueDrops, unreachable, natDrops, other atomic.Uint64

	sent, received []atomic.Uint64 // IP bytes per peer
}

type routedPacket struct {
	data []byte
	at   time.Time
}

// NamespaceSupport reports why Topology cannot run here, or nil if it can.
func NamespaceSupport() error {
	if os.Geteuid() != 0 {
		return errors.New("netem: namespaces need root")
	}
	if _, err := exec.LookPath("ip"); err != nil {
		return fmt.Errorf("netem: namespaces need the ip command: %w", err)
	}
	f, err := os.OpenFile("/dev/net/tun", os.O_RDWR, 0)
	if err != nil {
		return fmt.Errorf("netem: namespaces need /dev/net/tun: %w", err)
	}
	f.Close()
	return nil
}

// NewTopology creates one namespace per peer (each assigned to a region in
// n), addresses them in opts.Subnet and starts the router. The topology is
// torn down by Close or when ctx is cancelled; if NewTopology fails, what
// it created is removed before it returns. Namespaces left by processes
// that no longer exist are removed first.
func NewTopology(ctx context.Context, n *Network, peers []peer.ID, opts TopologyOptions) (*Topology, error) {
	if err := NamespaceSupport(); err != nil {
		return nil, err
	}
	if opts.Prefix == "" {
		opts.Prefix = "skyhive"
	}
	if strings.ContainsAny(opts.Prefix, "/ \t") {
		return nil, fmt.Errorf("netem: bad namespace prefix %q", opts.Prefix)
	}
	if !opts.Subnet.IsValid() {
		opts.Subnet = netip.MustParsePrefix("10.77.0.0/24")
	}
	opts.Subnet = opts.Subnet.Masked()
	if !opts.Subnet.Addr().Is4() {
		return nil, fmt.Errorf("netem: subnet %v is not IPv4", opts.Subnet)
	}
	if opts.MTU == 0 {
		opts.MTU = 1500
	}
	if opts.MTU < 576 || opts.MTU > 65535 {
		return nil, fmt.Errorf("netem: MTU %d outside [576, 65535]", opts.MTU)
	}
	if opts.QueueDelay <= 0 {
		opts.QueueDelay = 200 * time.Millisecond
	}
	if len(peers) == 0 {
		return nil, errors.New("netem: topology needs at least one peer")
	}
	if hostBits := 32 - opts.Subnet.Bits(); hostBits < 31 && len(peers) > 1<<hostBits-2 {
		return nil, fmt.Errorf("netem: %d peers do not fit in %v", len(peers), opts.Subnet)
	}
	removeStale(opts.Prefix)

	t := &Topology{
		n: n, opts: opts,
		index: make(map[netip.Addr]int),
		byID:  make(map[peer.ID]int),
		quit:  make(chan struct{}),
		links: make(map[[2]int]chan routedPacket),
	}
	addr := opts.Subnet.Addr()
	for i, id := range peers {
		if _, ok := n.Region(id); !ok {
			return nil, fmt.Errorf("netem: topology peer %d (%s): %w", i, id, ErrUnknownPeer)
		}
		if _, dup := t.byID[id]; dup {
			return nil, fmt.Errorf("netem: topology peer %s listed twice", id)
		}
		addr = addr.Next()
		t.ids = append(t.ids, id)
		t.addrs = append(t.addrs, addr)
		t.index[addr] = i
		t.byID[id] = i
	}
	t.nat = make([]*natFilter, len(t.ids))
	t.sent, t.received = make([]atomic.Uint64, len(t.ids)), make([]atomic.Uint64, len(t.ids))
	for _, id := range opts.NAT {
		i, ok := t.byID[id]
		if !ok {
			return nil, fmt.Errorf("netem: NAT peer %s: %w", id, ErrUnknownPeer)
		}
		t.nat[i] = newNATFilter()
	}
	for i := range t.ids {
		if err := t.addPeer(i); err != nil {
			t.Close()
			return nil, err
		}
	}
	for i := range t.ids {
		t.wg.Add(1)
		go t.readLoop(i)
	}
	t.stopFn = context.AfterFunc(ctx, func() { t.Close() })
	return t, nil
}

// addPeer creates peer i's namespace and TUN interface and configures it.
func (t *Topology) addPeer(i int) error {
	name := fmt.Sprintf("%s-%d-%d", t.opts.Prefix, os.Getpid(), i)
	if err := runIP("netns", "add", name); err != nil {
		return err
	}
	t.ns = append(t.ns, name)
	tun, err := createTUN(name, "sky0")
	if err != nil {
		return fmt.Errorf("netem: namespace %s: %w", name, err)
	}
	t.tuns = append(t.tuns, tun)
	prefix := netip.PrefixFrom(t.addrs[i], t.opts.Subnet.Bits())
	script := strings.Join([]string{
		"link set lo up",
		"link set sky0 mtu " + strconv.Itoa(t.opts.MTU),
		"addr add " + prefix.String() + " dev sky0",
		"link set sky0 up",
	}, "\n") + "\n"
	cmd := exec.Command("ip", "-n", name, "-batch", "-")
	cmd.Stdin = strings.NewReader(script)
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("netem: configuring namespace %s: %w: %s", name, err, strings.TrimSpace(string(out)))
	}
	return nil
}

// createTUN opens a TUN device named dev inside namespace ns. The file
// descriptor stays valid in this process after the thread leaves ns.
func createTUN(ns, dev string) (*os.File, error) {
	var f *os.File
	err := inNamespace(ns, func() error {
		fd, err := unix.Open("/dev/net/tun", unix.O_RDWR|unix.O_CLOEXEC|unix.O_NONBLOCK, 0)
		if err != nil {
			return fmt.Errorf("open /dev/net/tun: %w", err)
		}
		ifr, err := unix.NewIfreq(dev)
		if err != nil {
			unix.Close(fd)
			return err
		}
		ifr.SetUint16(unix.IFF_TUN | unix.IFF_NO_PI)
		if err := unix.IoctlIfreq(fd, unix.TUNSETIFF, ifr); err != nil {
			unix.Close(fd)
			return fmt.Errorf("TUNSETIFF %s: %w", dev, err)
		}
		f = os.NewFile(uintptr(fd), "tun:"+ns)
		return nil
	})
	return f, err
}

// inNamespace runs fn on an OS thread switched into namespace ns. The
// thread is switched back afterwards; if that fails it is discarded.
func inNamespace(ns string, fn func() error) error {
	target, err := unix.Open("/run/netns/"+ns, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("netem: opening namespace %s: %w", ns, err)
	}
	defer unix.Close(target)
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := unix.Open("/proc/thread-self/ns/net", unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("netem: current namespace: %w", err)
			return
		}
		defer unix.Close(orig)
		if err := unix.Setns(target, unix.CLONE_NEWNET); err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("netem: entering namespace %s: %w", ns, err)
			return
		}
		ferr := fn()
		if err := unix.Setns(orig, unix.CLONE_NEWNET); err != nil {
			// Leave the thread locked: it dies with this goroutine.
			errc <- errors.Join(ferr, fmt.Errorf("netem: leaving namespace %s: %w", ns, err))
			return
		}
		runtime.UnlockOSThread()
		errc <- ferr
	}()
	return <-errc
}

func runIP(args ...string) error {
	out, err := exec.Command("ip", args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("netem: ip %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}

// removeStale deletes namespaces named prefix-PID-N whose PID is gone.
func removeStale(prefix string) {
	entries, err := os.ReadDir("/run/netns")
	if err != nil {
		return
	}
	for _, e := range entries {
		rest, ok := strings.CutPrefix(e.Name(), prefix+"-")
		if !ok {
			continue
		}
		pidStr, _, ok := strings.Cut(rest, "-")
		if !ok {
			continue
		}
		pid, err := strconv.Atoi(pidStr)
		if err != nil || pid <= 0 || pid == os.Getpid() {
			continue
		}
		if _, err := os.Stat("/proc/" + pidStr); err == nil {
			continue
		}
		runIP("netns", "del", e.Name())
	}
}

// Addr returns the IPv4 address of peer id.
func (t *Topology) Addr(id peer.ID) (netip.Addr, bool) {
	i, ok := t.byID[id]
	if !ok {
		return netip.Addr{}, false
	}
	return t.addrs[i], true
}

// Namespace returns the name of peer id's namespace, for `ip netns exec`.
func (t *Topology) Namespace(id peer.ID) (string, bool) {
	i, ok := t.byID[id]
	if !ok {
		return "", false
	}
	return t.ns[i], true
}

// Command returns a command that runs name with args inside peer id's
// namespace (via `ip netns exec`).
func (t *Topology) Command(ctx context.Context, id peer.ID, name string, args ...string) (*exec.Cmd, error) {
	ns, ok := t.Namespace(id)
	if !ok {
		return nil, fmt.Errorf("netem: %s is not in the topology", id)
	}
	return exec.CommandContext(ctx, "ip", append([]string{"netns", "exec", ns, name}, args...)...), nil
}

// Do runs fn on an OS thread inside peer id's namespace. Sockets that fn
// creates (listeners, dialled connections) belong to that namespace and can
// be used from any goroutine afterwards. fn must not start goroutines that
// expect to be in the namespace.
func (t *Topology) Do(id peer.ID, fn func() error) error {
	ns, ok := t.Namespace(id)
	if !ok {
		return fmt.Errorf("netem: %s is not in the topology", id)
	}
	return inNamespace(ns, fn)
}

// Stats returns the router's counters.
func (t *Topology) Stats() TopologyStats {
	return TopologyStats{
		Forwarded:   t.forwarded.Load(),
		Lost:        t.lost.Load(),
		QueueDrops:  t.queueDrops.Load(),
		Unreachable: t.unreachable.Load(),
		NATDrops:    t.natDrops.Load(),
		Other:       t.other.Load(),
	}
}

// readLoop routes the packets peer i sends.
func (t *Topology) readLoop(i int) {
	defer t.wg.Done()
	buf := make([]byte, 65536)
	for {
		n, err := t.tuns[i].Read(buf)
		if err != nil {
			return // closed
		}
		pkt := buf[:n]
		if n < 20 || pkt[0]>>4 != 4 {
			t.other.Add(1)
			continue
		}
		j, ok := t.index[netip.AddrFrom4([4]byte(pkt[16:20]))]
		if !ok || j == i {
			t.other.Add(1)
			continue
		}
		if now := t.n.clk.Now(); t.nat[i] != nil || t.nat[j] != nil {
			if t.nat[i] != nil {
				t.nat[i].outbound(pkt, now)
			}
			if t.nat[j] != nil && !t.nat[j].inbound(pkt, now) {
				t.natDrops.Add(1)
				continue
			}
		}
		tr, err := t.n.transmit(t.ids[i], t.ids[j], n, t.opts.QueueDelay)
		switch {
		case errors.Is(err, errQueueFull):
			t.queueDrops.Add(1)
			continue
		case err != nil:
			t.unreachable.Add(1)
			continue
		case tr.Lost:
			t.lost.Add(1)
			continue
		}
		q := t.link(i, j)
		if q == nil {
			return
		}
		select {
		case q <- routedPacket{data: append([]byte(nil), pkt...), at: tr.Arrive}:
			t.sent[i].Add(uint64(n))
		default:
			t.queueDrops.Add(1)
		}
	}
}

// link returns the delay line from peer i to peer j, starting it on first
// use; nil once the topology is closing.
func (t *Topology) link(i, j int) chan routedPacket {
	t.linkMu.Lock()
	defer t.linkMu.Unlock()
	select {
	case <-t.quit:
		return nil
	default:
	}
	k := [2]int{i, j}
	q, ok := t.links[k]
	if !ok {
		q = make(chan routedPacket, 8192)
		t.links[k] = q
		t.wg.Add(1)
		go t.deliverLoop(q, j)
	}
	return q
}

// deliverLoop writes each packet into the destination TUN at its arrival.
func (t *Topology) deliverLoop(q chan routedPacket, j int) {
	dst := t.tuns[j]
	defer t.wg.Done()
	w := waiter{clk: t.n.clk}
	defer w.stop()
	for {
		var p routedPacket
		select {
		case p = <-q:
		case <-t.quit:
			return
		}
		if !w.until(p.at, t.quit) {
			return
		}
		if _, err := dst.Write(p.data); err != nil {
			if errors.Is(err, os.ErrClosed) {
				return
			}
			t.other.Add(1)
			continue
		}
		t.forwarded.Add(1)
		t.received[j].Add(uint64(len(p.data)))
	}
}

// PeerBytes returns the IP bytes peer id sent into the network (that the
// router accepted) and received from it.
func (t *Topology) PeerBytes(id peer.ID) (sent, received uint64, ok bool) {
	i, ok := t.byID[id]
	if !ok {
		return 0, 0, false
	}
	return t.sent[i].Load(), t.received[i].Load(), true
}

// Close stops the router and deletes the namespaces. It is safe to call
// more than once and from several goroutines.
func (t *Topology) Close() error {
	t.closeOnce.Do(func() {
		if t.stopFn != nil {
			t.stopFn()
		}
		t.linkMu.Lock()
		close(t.quit)
		t.linkMu.Unlock()
		var errs []error
		for _, f := range t.tuns {
			if err := f.Close(); err != nil {
				errs = append(errs, err)
			}
		}
		t.wg.Wait()
		for _, ns := range t.ns {
			if err := runIP("netns", "del", ns); err != nil {
				errs = append(errs, err)
			}
		}
		t.closeErr = errors.Join(errs...)
	})
	return t.closeErr
}

// MeasureNamespaces measures the emulation of a link with params p in mode
// 2: kernel TCP between two namespaces of a two-peer Topology, both
// directions set to p. It needs root (see NamespaceSupport).
func MeasureNamespaces(ctx context.Context, p LinkParams, o MeasureOptions) (Measurement, error) {
	n, a, b, err := twoPeers(p)
	if err != nil {
		return Measurement{}, err
	}
	topo, err := NewTopology(ctx, n, []peer.ID{a, b}, TopologyOptions{Prefix: "skyhive-measure"})
	if err != nil {
		return Measurement{}, err
	}
	defer topo.Close()
	serverAddr, _ := topo.Addr(b)
	var ln net.Listener
	err = topo.Do(b, func() error {
		var err error
		ln, err = net.Listen("tcp", netip.AddrPortFrom(serverAddr, 0).String())
		return err
	})
	if err != nil {
		return Measurement{}, fmt.Errorf("netem: measure: listen in namespace: %w", err)
	}
	defer ln.Close()
	client, server, err := dialAccept(ctx, ln, func(ctx context.Context) (net.Conn, error) {
		var c net.Conn
		err := topo.Do(a, func() error {
			var d net.Dialer
			var err error
			c, err = d.DialContext(ctx, "tcp", ln.Addr().String())
			return err
		})
		return c, err
	})
	if err != nil {
		return Measurement{}, err
	}
	return Measure(ctx, client, server, o)
}
