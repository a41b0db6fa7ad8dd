package bench

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"
	ma "github.com/multiformats/go-multiaddr"

	"github.com/skyhive/skyhive/dht"
	"github.com/skyhive/skyhive/hostile"
	"github.com/skyhive/skyhive/p2p"
)

// hostileDHTKey is the key the honest DHT workload declares under in
// round r: a fresh key each round, so that the phases without attack read
// a key no crowd has reached yet (a crowd stays for the records' hours),
// and the crowding attack fills the round's key, as an attacker that
// watches what peers read would.
func hostileDHTKey(r int64) string { return fmt.Sprintf("ffn.r%d.", r) }

// hostileSlowIdentities is how many identities the slow senders of the
// DHT case have: together they could open more streams of the DHT
// protocol than libp2p lets it hold, were they not bounded per address.
const hostileSlowIdentities = 16

// hostileDHT measures an honest peer's declarations per second on a DHT
// node (store its record under a key many peers declare under, then read
// the key and find the record), without attack, while one writer crowds
// the key with long-lived subkeys (dht-crowd-key), and while slow senders
// from 16 identities of one address hold streams of the DHT protocol
// open. The honest peer connects over IPv6 loopback, the attackers over
// IPv4, so that the victim tells their addresses apart as it would two
// machines'; without IPv6 loopback the case is skipped.
func hostileDHT(ctx context.Context, o Options, c hostileConfig, attackers []*p2p.Host) ([]Result, error) {
	if l, err := net.Listen("tcp6", "[::1]:0"); err != nil {
		o.Logf("hostile: dht cases skipped: no IPv6 loopback (%v)", err)
		return nil, nil
	} else {
		l.Close()
	}
	reg := o.registerer()
	var closers []func() error
	defer func() {
		for _, f := range slices.Backward(closers) {
			_ = f()
		}
	}()
	node := func(client bool) (*p2p.Host, *dht.Node, error) {
		listen := []string{"/ip4/127.0.0.1/tcp/0", "/ip6/::1/tcp/0"}
		if client {
			listen = []string{"/ip6/::1/tcp/0"}
		}
		h, err := p2p.New(ctx, p2p.Config{ListenAddrs: listen, Metrics: reg})
		if err != nil {
			return nil, nil, err
		}
		closers = append(closers, h.Close)
		n, err := dht.New(h, dht.Config{ClientMode: client})
		if err != nil {
			return nil, nil, err
		}
		closers = append(closers, n.Close)
		return h, n, nil
	}
	vh, _, err := node(false)
	if err != nil {
		return nil, err
	}
	dh, _, err := node(false)
	if err != nil {
		return nil, err
	}
	ch, cn, err := node(true)
	if err != nil {
		return nil, err
	}
	v6 := family(vh.AddrInfo(), true)
	if err := ch.Connect(ctx, v6); err != nil {
		return nil, err
	}
	if err := cn.Bootstrap(ctx, []peer.AddrInfo{v6}); err != nil {
		return nil, err
	}
	v4 := func(h *p2p.Host) peer.AddrInfo { return family(h.AddrInfo(), false) }
	slowHosts := make([]*p2p.Host, hostileSlowIdentities)
	for i := range slowHosts {
		if slowHosts[i], err = p2p.New(ctx, p2p.Config{ListenAddrs: []string{"/ip4/127.0.0.1/tcp/0"}}); err != nil {
			return nil, err
		}
		closers = append(closers, slowHosts[i].Close)
	}
	var round atomic.Int64
	w := workload{newRound: func() { round.Add(1) }}
	wctx, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Go(func() {
		for wctx.Err() == nil {
			err := declareAndFind(wctx, cn, hostileDHTKey(round.Load()), ch.ID().String())
			switch {
			case err == nil:
				w.progress.Add(1)
			case wctx.Err() == nil:
				w.fail(err)
				if errors.Is(err, dht.ErrNoPeers) {
					// The node dropped the victim after calls timed
					// out: join again, as a client would.
					_ = cn.Bootstrap(wctx, []peer.AddrInfo{v6})
				}
			}
		}
	})
	defer func() { stop(); wg.Wait() }()
	only := func(as []hostile.Attack, name string) []hostile.Attack {
		return slices.DeleteFunc(as, func(a hostile.Attack) bool { return a.Name != name })
	}
	crowdAt := func(h *p2p.Host) *hostile.Flood {
		return &hostile.Flood{Hosts: attackers, Attacks: only(hostile.DHTAttacks(hostile.DHTTarget{Node: v4(h),
			CrowdKeys: func() []string { return []string{hostileDHTKey(round.Load())} }}), "dht-crowd-key"),
			Rate: c.Rate / 40, MaxInflight: c.MaxInflight}
	}
	slowAt := func(h *p2p.Host) *hostile.Flood {
		return &hostile.Flood{Hosts: slowHosts, Attacks: []hostile.Attack{hostile.SlowLoris(v4(h), dht.ProtocolID)},
			Rate: c.Rate, MaxInflight: 1 << 14}
	}
	var out []Result
	for _, k := range []struct {
		name          string
		flood, decoy  *hostile.Flood
		identities    int
		rate          float64
		victimsFormat string
	}{
		{"dht/crowd-key", crowdAt(vh), crowdAt(dh), len(attackers), c.Rate / 40,
			"Honest peer: stores its record under %s and reads the key until it finds it, one at a time over IPv6, a fresh key each round; the attacker stores 256 three-hour subkeys of junk per request under the round's key from IPv4 (dht-crowd-key), so the key is crowded from the round's attack phase on; %d honest failures."},
		{"dht/slow-streams", slowAt(vh), slowAt(dh), hostileSlowIdentities, c.Rate,
			"Honest peer: stores its record under %s and reads the key until it finds it, one at a time over IPv6; the attacker opens streams of the DHT protocol that announce 64 KiB and send a byte every 250 ms (slow-loris), each held until the phase ends; %d honest failures."},
	} {
		kc := c
		kc.Identities, kc.Rate = k.identities, k.rate
		p, err := alternate(ctx, o, k.name, kc, &w, k.flood, k.decoy)
		if err != nil {
			return nil, err
		}
		out = append(out, hostileResults(kc, k.name, "honest_declarations_per_s", "declarations/s", p, k.flood.Tally(),
			fmt.Sprintf(k.victimsFormat, "ffn.rN.", w.errs.Load()))...)
	}
	return out, nil
}

// declareAndFind stores the honest peer's record under key and
// reads the key until the record is there (at most 2 s).
func declareAndFind(ctx context.Context, n *dht.Node, key, subkey string) error {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	if _, err := n.Store(ctx, key, subkey, []byte("honest"), time.Now().Add(time.Minute)); err != nil {
		return fmt.Errorf("store: %w", err)
	}
	items, err := n.Get(ctx, key)
	if err != nil {
		return fmt.Errorf("get: %w", err)
	}
	if _, ok := items[subkey]; !ok {
		return fmt.Errorf("get: the honest record is not among the %d items read", len(items))
	}
	return nil
}

// family keeps ai's IPv6 addresses (six) or its others.
func family(ai peer.AddrInfo, six bool) peer.AddrInfo {
	out := peer.AddrInfo{ID: ai.ID}
	for _, a := range ai.Addrs {
		if _, err := a.ValueForProtocol(ma.P_IP6); (err == nil) == six {
			out.Addrs = append(out.Addrs, a)
		}
	}
	return out
}
