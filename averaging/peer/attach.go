package peer

import (
	"context"
	"errors"
	"fmt"

	"github.com/skyhive/skyhive/averaging"
	"github.com/skyhive/skyhive/averaging/optimizer"
	"github.com/skyhive/skyhive/checkpoint"
	"github.com/skyhive/skyhive/node"
	"github.com/skyhive/skyhive/optim"
)

// Member is a peer's place in its run when its training loop runs
// elsewhere (the PyTorch daemon, package bridge): its node, the averager
// and the optimizer that wraps the loop's optimizer. Close leaves the run.
type Member struct {
	// Opt is the averaging optimizer; the loop calls its Step.
	Opt *optimizer.Optimizer
	// Node is the peer's node, joined to the swarm's DHT.
	Node *node.Node
	// Joined is the number of donors the starting state came from (0: the
	// shared initial weights).
	Joined int

	avg        *averaging.Averager
	roster     []averaging.Member // rank matchmaking only
	gate       *rosterGate        // rank matchmaking only
	ownNode    bool
	stopStatus func()
}

// Attach joins cfg's run with a model whose parameters inner optimizes and
// whose signature is sig (every peer of a run must give the same one): it
// opens the peer's node and joins the DHT, waits for MinPeers peers of the
// run, builds the averaging optimizer over inner and, if the swarm has
// made progress, downloads its state into inner's parameters. It runs
// cfg.Status until Close. Only cfg's networking and averaging options
// apply (no model, data or checkpoint).
// Errors name what to fix; ctx ending is returned as is.
func Attach(ctx context.Context, cfg Config, inner optim.Optimizer, sig string) (*Member, error) {
	if err := cfg.defaults(); err != nil {
		return nil, err
	}
	if len(cfg.DHT) == 0 {
		return nil, fmt.Errorf("%w: no DHT to join: give the multiaddr of a `skyhive dht` node or of another peer (/ip4/.../tcp/.../p2p/ID)", ErrConfig)
	}
	n, err := openNode(ctx, cfg)
	if err != nil {
		return nil, err
	}
	var res Result
	m, err := join(ctx, cfg, n, inner, sig, nil, &res)
	if err != nil {
		n.Close()
		return nil, err
	}
	m.ownNode, m.Joined = true, res.Joined
	live := &liveState{}
	live.setOptimizer(m.Opt)
	m.stopStatus = startStatus(context.WithoutCancel(ctx), cfg, n.Host(), n.DHT(), live)
	if cfg.Matchmaking == averaging.MatchRanks {
		if err := startBarrier(ctx, cfg, n.Host(), m.gate, m.roster); err != nil {
			m.Close()
			return nil, err
		}
	}
	return m, nil
}

// Close leaves the run: the optimizer stops (groups in flight are told at
// once), then the averager and the peer's own node close.
func (m *Member) Close() error {
	if m.stopStatus != nil {
		m.stopStatus()
	}
	err := m.Opt.Close()
	m.avg.Close()
	if m.gate != nil {
		m.gate.close()
	}
	if m.ownNode {
		err = errors.Join(err, m.Node.Close())
	}
	return err
}

// join makes the averager and the optimizer over inner on n, once MinPeers
// peers of the run are listed, and sets the starting state (the
// checkpoint ck, or the swarm's, or the shared initial weights), noting
// it in res.
func join(ctx context.Context, cfg Config, n *node.Node, inner optim.Optimizer, sig string, ck *checkpoint.File, res *Result) (*Member, error) {
	h, dn := n.Host(), n.DHT()
	avg := averaging.New(h, averaging.Config{Codec: cfg.Codec, Timeout: cfg.Timeout, Aggregation: cfg.Aggregation, MaxNormRatio: cfg.MaxNormRatio})
	ocfg := optimizer.Config{
		Algo: cfg.Algo, GroupSize: cfg.GroupSize, Tau: cfg.Tau, Period: cfg.Period,
		RunID: cfg.RunID, Matchmaking: cfg.Matchmaking, DHT: dn, RoundInterval: cfg.RoundInterval,
		Model: sig, TargetBatchSize: cfg.TargetBatchSize,
		InnerSteps: cfg.InnerSteps, WarmupInnerSteps: cfg.WarmupInnerSteps, OuterLR: cfg.OuterLR, OuterMomentum: cfg.OuterMomentum,
		Fragments: cfg.Fragments, OverlapSteps: cfg.OverlapSteps,
		Metrics: cfg.Metrics,
	}
	mm := averaging.NewMatchmaker(dn, h, averaging.MatchConfig{Run: cfg.RunID, Interval: cfg.RoundInterval, Model: sig})
	var gate *rosterGate
	fail := func(err error) (*Member, error) {
		if gate != nil {
			gate.close()
		}
		avg.Close()
		return nil, err
	}
	if cfg.Matchmaking == averaging.MatchRanks {
		// Answer roster questions from the moment this peer is listed:
		// a listing that does not answer is left out of the roster.
		gate = openRosterGate(h, cfg.RunID)
	}
	others, founder, err := waitForPeers(ctx, cfg, mm, dn, h.ID(), sig)
	if err != nil {
		return fail(err)
	}
	if gate != nil {
		peers, err := formRoster(ctx, cfg, h, gate, mm, dn, sig)
		if err != nil {
			return fail(err)
		}
		ocfg.Roster, ocfg.Rank = roster(peers, h.ID())
	}
	opt, err := optimizer.New(avg, inner, ocfg)
	if err != nil {
		return fail(err)
	}
	m := &Member{Opt: opt, Node: n, avg: avg, roster: ocfg.Roster, gate: gate}
	joinSwarm := !founder && bestRound(others) > 0 && cfg.Matchmaking == averaging.MatchDHT
	if err := startState(ctx, cfg, opt, ck, dn, joinSwarm, res); err != nil {
		m.Close()
		return nil, err
	}
	return m, nil
}
