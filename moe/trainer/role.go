package trainer

import (
	"context"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	"github.com/skyhive/skyhive/launch"
	"github.com/skyhive/skyhive/metrics"
	"github.com/skyhive/skyhive/moe"
	"github.com/skyhive/skyhive/moe/client"
	"github.com/skyhive/skyhive/moe/server"
	"github.com/skyhive/skyhive/node"
	"github.com/skyhive/skyhive/p2p"
)

// RoleConfig configures RunRole: a MoE trainer on a node of its own, as
// `skyhive train moe` and `skyhive @FILE` run one.
type RoleConfig struct {
	// Node is the trainer's node: its host, the swarm's DHT peers it
	// joins (required), its status record's region and period, its
	// metrics endpoint and its log. RunRole sets the rest: a DHT client
	// over the emulated link, the status role, messages of up to 256 MiB.
	Node node.Config
	// Trainer is the run's options, as the command's flags and a config
	// file give them (see launch.MoETrainer); its Net and Process are read
	// only through Node.
	Trainer launch.MoETrainer
	// Stdout receives the result and Stderr the progress and notices
	// (nil: discarded).
	Stdout, Stderr io.Writer
	// Announce, if set, tells where others reach the trainer once its
	// host runs.
	Announce func(ctx context.Context, h *p2p.Host)
}

// RunRole trains the local layers of a DMoE model against a live swarm:
// it checks the options (Check; the DHT's peers are required: errors
// about options are *launch.FieldError), reads the data, joins the swarm's DHT, makes the model fit the
// experts the grids' servers declare (MatchExperts), publishes its status
// record while it trains, then prints the result and fails if more than
// MaxFailedSteps of the steps failed.
func RunRole(ctx context.Context, cfg RoleConfig) error {
	if cfg.Stdout == nil {
		cfg.Stdout = io.Discard
	}
	if cfg.Stderr == nil {
		cfg.Stderr = io.Discard
	}
	if len(cfg.Trainer.DHT) == 0 {
		return &launch.FieldError{Fields: []string{"dht"}, Text: "%s is required: the address of the swarm's DHT, e.g. printed by `skyhive server` or `skyhive dht`"}
	}
	log := cfg.Stderr
	j, err := NewJob(cfg.Trainer, log)
	if err != nil {
		return err
	}
	n, tr, err := j.startNode(ctx, cfg)
	if err != nil {
		return err
	}
	defer n.Close()
	if j.tm, err = metrics.NewTraining(n.Metrics()); err != nil {
		return err
	}
	defer j.tm.Close()
	if cfg.Announce != nil {
		cfg.Announce(ctx, n.Host())
	}
	if err := j.MatchExperts(ctx, log, n.DHT(), cfg.Trainer.Hidden != 0); err != nil {
		return err
	}
	j.live = &metrics.Live{}
	if err := n.StartStatus(j.live.Sample); err != nil {
		return err
	}
	res, err := j.Train(ctx, log, tr, n.DHT())
	if err != nil {
		return err
	}
	return j.finish(cfg.Stdout, log, res)
}

// startNode starts the trainer's node, its DHT client calling over the
// emulated link, and returns the node and that link, over which the
// trainer calls the experts too.
func (j *Job) startNode(ctx context.Context, cfg RoleConfig) (*node.Node, p2p.Transport, error) {
	ncfg := cfg.Node
	if ncfg.Host != nil {
		h := *ncfg.Host
		h.MaxMessageBytes = 256 << 20
		ncfg.Host = &h
	} else {
		ncfg.Net.MaxMessageBytes = 256 << 20
	}
	ncfg.DHT.Mode, ncfg.Status.Role = node.DHTClient, metrics.RoleTrainer
	if ncfg.Log == nil {
		ncfg.Log = cfg.Stderr
	}
	var tr p2p.Transport
	ncfg.DHTTransport = func(h p2p.Transport) (p2p.Transport, error) {
		var err error
		tr, err = EmulateLink(h, j.link, j.cfg.Seed)
		return tr, err
	}
	n, err := node.New(ctx, ncfg)
	if err != nil && ctx.Err() != nil {
		return nil, nil, ctx.Err()
	}
	return n, tr, err
}

// expertsWait bounds how long MatchExperts waits for the grids' experts
// to be declared before training starts without checking them.
const expertsWait = 10 * time.Second

// MatchExperts reads what the grids' experts declare on the DHT (their type
// and hidden size; client.Declared) and makes the model fit them: unless
// hiddenSet it takes the experts' hidden size, and it refuses, naming the
// option to change, experts of another type, experts of several sizes, or
// a hidden size that differs from theirs. It waits up to expertsWait for
// the first declarations; servers that declare neither type nor size are
// not checked.
func (j *Job) MatchExperts(ctx context.Context, log io.Writer, getter client.Getter, hiddenSet bool) error {
	infos, err := declared(ctx, getter, j.grids)
	if err != nil {
		return err
	}
	if len(infos) == 0 {
		fmt.Fprintf(log, "no experts of --grids %s are declared on the DHT yet: training with --hidden %d\n", j.cfg.Grids, j.hidden)
		return nil
	}
	sized := map[int]moe.ExpertInfo{} // an expert of each declared size
	for _, e := range infos {
		if e.Type != "" && e.Type != server.TypeFFN {
			return fmt.Errorf("expert %s on %s is a %s expert, but a DMoE trainer calls %s experts: start its server with --expert-type %s, or choose other --grids",
				e.UID, p2p.ShortID(e.Peer.ID.String()), e.Type, server.TypeFFN, server.TypeFFN)
		}
		if e.Hidden > 0 {
			sized[e.Hidden] = e
		}
	}
	if len(sized) > 1 {
		var sizes []string
		for h, e := range sized {
			sizes = append(sizes, fmt.Sprintf("%s has hidden %d", e.UID, h))
		}
		slices.Sort(sizes)
		return fmt.Errorf("the experts of --grids %s differ in size (%s): start the servers with the same --hidden", j.cfg.Grids, strings.Join(sizes, ", "))
	}
	for h, e := range sized {
		switch {
		case h == j.hidden:
		case hiddenSet:
			return fmt.Errorf("the model's --hidden %d, but expert %s on %s has hidden %d: pass --hidden %d (or leave it out), or start the servers with --hidden %d",
				j.hidden, e.UID, p2p.ShortID(e.Peer.ID.String()), h, h, j.hidden)
		default:
			fmt.Fprintf(log, "the swarm's experts have hidden size %d: the model uses it (--hidden)\n", h)
			j.hidden = h
		}
	}
	return nil
}

// declared reads the experts the grids declare, waiting up to expertsWait
// for each grid's first declarations.
func declared(ctx context.Context, getter client.Getter, grids []moe.Grid) ([]moe.ExpertInfo, error) {
	var infos []moe.ExpertInfo
	deadline := time.Now().Add(expertsWait)
	for _, g := range grids {
		for {
			found, err := client.Declared(ctx, getter, g)
			if err != nil && ctx.Err() != nil {
				return nil, ctx.Err()
			}
			if len(found) > 0 || time.Now().After(deadline) {
				infos = append(infos, found...)
				break
			}
			select {
			case <-ctx.Done():
				return nil, ctx.Err()
			case <-time.After(200 * time.Millisecond):
			}
		}
	}
	return infos, nil
}
