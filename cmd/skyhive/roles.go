package main

import (
	"context"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/skyhive/skyhive/averaging/peer"
	"github.com/skyhive/skyhive/launch"
	"github.com/skyhive/skyhive/p2p"
)

// runRole runs a role from a config file for it.
type runRole func(ctx context.Context, stdout, stderr io.Writer, f launch.File) error

// roles are the roles a config file may name, by launch role name. The
// averaging peer, the pipeline worker, the DHT node, the expert server
// and the MoE trainer run from their typed configs, which their flags feed
// too (fileRole); the pipeline coordinator's file also says which options
// were given, for the model defaults (runPipelineFile).
func roles() map[string]runRole {
	return map[string]runRole{
		launch.RolePeer:       fileRole(infallible(peer.Defaults), runPeerRole),
		launch.RoleWorker:     fileRole(infallible(workerDefaults), runWorkerRole),
		launch.RoleDHT:        fileRole(infallible(dhtDefaults), runDHTRole),
		launch.RoleServer:     fileRole(infallible(serverDefaults), runServerRole),
		launch.RoleMoETrainer: fileRole(infallible(moeTrainerDefaults), runMoETrainerRole),
		launch.RolePipeline:   runPipelineFile,
	}
}

// fileRole runs a role from its config file: the file's fields over
// defaults (those of the role's command without flags), the file's
// process options applied, then run with the config.
func fileRole[C any, P interface {
	*C
	launch.Config
	ProcessOptions() launch.Process
}](defaults func() (C, error), run func(ctx context.Context, stdout, stderr io.Writer, c C) error) runRole {
	return func(ctx context.Context, stdout, stderr io.Writer, f launch.File) error {
		c, err := defaults()
		if err != nil {
			return err
		}
		if err := f.Decode(P(&c)); err != nil { // refuses unknown fields and bad values
			return err
		}
		if err := selectProcess(P(&c).ProcessOptions()); err != nil {
			return err
		}
		return run(ctx, stdout, stderr, c)
	}
}

// infallible is defaults that cannot fail, as fileRole takes them.
func infallible[C any](defaults func() C) func() (C, error) {
	return func() (C, error) { return defaults(), nil }
}

// roleHost checks a role's network and process options, naming their
// flags, and returns its host's configuration (with a memory budget, it
// sets the process's soft memory limit).
func roleHost(n launch.Net, p launch.Process) (p2p.Config, error) {
	status := statusFlags{region: p.Region, every: max(time.Duration(p.StatusEvery), 0)}
	if err := status.check(); err != nil {
		return p2p.Config{}, err
	}
	net := connectFlagsOf(n)
	if _, err := net.seeds(); err != nil {
		return p2p.Config{}, err
	}
	return net.config()
}

// runRoleFile runs `skyhive @FILE`: the role the config file at path
// names, with its config.
func runRoleFile(ctx context.Context, path string, stdout, stderr io.Writer) error {
	f, err := launch.Read(path)
	if err != nil {
		return err
	}
	all := roles()
	run, ok := all[f.Role]
	if !ok {
		return fmt.Errorf("%s: unknown role %q (want %s)", path, f.Role, strings.Join(slices.Sorted(maps.Keys(all)), ", "))
	}
	return run(ctx, stdout, stderr, f)
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

// launchNet is the connection flags as a config's network options.
func (c *connectFlags) launchNet() launch.Net { return c.Net }

// connectFlagsOf is a config's network options as connection flags.
func connectFlagsOf(n launch.Net) connectFlags { return connectFlags{n} }
