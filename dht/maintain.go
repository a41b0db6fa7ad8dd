// Background maintenance of a node: republishing its records, dropping
// expired ones, refreshing the routing table.

package dht

import (
	"context"
	"errors"
	"time"
)

// Republish stores every unexpired record this node stored itself again to
// the current nearest peers, so records outlive the replicas that held
// them. It returns the number of keys republished.
func (n *Node) Republish(ctx context.Context) (int, error) {
	if n.own == nil {
		return 0, nil
	}
	now := n.clk.Now().UnixNano()
	n.mu.Lock()
	n.own.cleanup(now)
	byKey := make(map[string][]*entry)
	for _, e := range n.own.all(now) {
		byKey[e.Key] = append(byKey[e.Key], e)
	}
	n.mu.Unlock()
	done := 0
	var errs []error
	for key, es := range byKey {
		if ctx.Err() != nil {
			break
		}
		for len(es) > 0 {
			batch := es[:min(len(es), MaxStoreBatch)]
			es = es[len(batch):]
			if _, err := n.storeEntries(ctx, key, batch); err != nil {
				errs = append(errs, err)
			}
		}
		done++
	}
	if err := ctx.Err(); err != nil {
		errs = append(errs, err)
	}
	return done, errors.Join(errs...)
}

// Cleanup drops expired records from storage and cache.
func (n *Node) Cleanup() {
	now := n.clk.Now().UnixNano()
	n.mu.Lock()
	defer n.mu.Unlock()
	n.store.cleanup(now)
	if n.cache != nil {
		n.cache.cleanup(now)
	}
	if n.own != nil {
		n.own.cleanup(now)
	}
}

// maintain runs the periodic refresh, republish and cleanup until Close.
func (n *Node) maintain() {
	defer n.wg.Done()
	tick := func(d time.Duration) (<-chan time.Time, func()) {
		if d <= 0 {
			return nil, func() {}
		}
		t := n.clk.NewTicker(d)
		return t.C(), t.Stop
	}
	refresh, stop1 := tick(n.cfg.RefreshInterval)
	defer stop1()
	republish, stop2 := tick(n.cfg.RepublishInterval)
	defer stop2()
	cleanup, stop3 := tick(n.cfg.CleanupInterval)
	defer stop3()
	for {
		select {
		case <-n.ctx.Done():
			return
		case <-refresh:
			_ = n.Refresh(n.ctx)
		case <-republish:
			_, _ = n.Republish(n.ctx)
		case <-cleanup:
			n.Cleanup()
		}
	}
}
