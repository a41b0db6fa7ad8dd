package main

import (
	"context"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	"github.com/skyhive/skyhive/launch"
)

// role is a role that `skyhive @FILE` runs: defaults returns its config
// without flags (a pointer, which the file's fields replace), run runs it.
type role struct {
	defaults func() (launch.Config, error)
	run      func(ctx context.Context, stdout, stderr io.Writer, cfg launch.Config) error
}

// roles are the roles a config file may name, by launch role name.
func roles() map[string]role {
	return map[string]role{
		launch.RolePeer: {
			defaults: func() (launch.Config, error) { c, err := peerDefaults(); return &c, err },
			run: func(ctx context.Context, stdout, stderr io.Writer, cfg launch.Config) error {
				c := cfg.(*launch.Peer)
				if err := selectProcess(c.Process); err != nil {
					return err
				}
				return runPeerRole(ctx, stdout, stderr, *c)
			},
		},
	}
}

// runRoleFile runs `skyhive @FILE`: the role the config file at path
// names, with its config.
func runRoleFile(ctx context.Context, path string, stdout, stderr io.Writer) error {
	f, err := launch.Read(path)
	if err != nil {
		return err
	}
	all := roles()
	r, ok := all[f.Role]
	if !ok {
		names := make([]string, 0, len(all))
		for n := range all {
			names = append(names, n)
		}
		slices.Sort(names)
		return fmt.Errorf("%s: unknown role %q (want %s)", path, f.Role, strings.Join(names, ", "))
	}
	cfg, err := r.defaults()
	if err != nil {
		return err
	}
	if err := f.Decode(cfg); err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	return r.run(ctx, stdout, stderr, cfg)
}

// selectProcess applies a config's process options that the root command's
// flags set otherwise: the GEMM backend.
func selectProcess(p launch.Process) error {
	if p.GEMM == "" {
		return selectGEMM("auto")
	}
	return selectGEMM(p.GEMM)
}

// durationVar lets a flag set a launch.Duration.
func durationVar(d *launch.Duration) *time.Duration { return (*time.Duration)(d) }

// launchStatusEvery is --status-every as a config field: 0 (never) is
// negative there, where 0 is the default.
func launchStatusEvery(every time.Duration) launch.Duration {
	if every == 0 {
		return -1
	}
	return launch.Duration(every)
}

// launchNet is the connection flags as a config's network options.
func (c *connectFlags) launchNet() launch.Net {
	return launch.Net{Listen: c.listen, Announce: c.announce, Identity: c.identity, DHT: c.dht,
		Relays: c.relays, RelayService: c.relayService, HolePunching: c.holePunching, AutoNAT: c.autoNAT,
		Reachability: c.reachability, SwarmSecret: c.swarmSecret, SwarmKey: c.swarmKey,
		MemberToken: c.memberToken, MemoryMiB: c.memoryMiB}
}

// connectFlagsOf is a config's network options as connection flags.
func connectFlagsOf(n launch.Net) connectFlags {
	return connectFlags{listen: n.Listen, announce: n.Announce, identity: n.Identity, dht: n.DHT,
		relays: n.Relays, relayService: n.RelayService, holePunching: n.HolePunching, autoNAT: n.AutoNAT,
		reachability: n.Reachability, swarmSecret: n.SwarmSecret, swarmKey: n.SwarmKey,
		memberToken: n.MemberToken, memoryMiB: n.MemoryMiB}
}
