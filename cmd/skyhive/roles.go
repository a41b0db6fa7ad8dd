package main

import (
	"cmp"
	"context"
	"io"
	"time"

	"github.com/skyhive/skyhive/averaging/peer"
	"github.com/skyhive/skyhive/launch"
	"github.com/skyhive/skyhive/p2p"
)

// roles are the roles a config file may name, by launch role name. The
// averaging peer, the pipeline worker, the DHT node, the expert server
// and the MoE trainer run from their typed configs, which their flags feed
// too (launch.FileRunner); the pipeline coordinator's file also says which
// options were given, for the model defaults (runPipelineFile).
func roles() map[string]launch.Runner {
	return map[string]launch.Runner{
		launch.RolePeer:       launch.FileRunner(peer.Defaults, selectProcess, runPeerRole),
		launch.RoleWorker:     launch.FileRunner(workerDefaults, selectProcess, runWorkerRole),
		launch.RoleDHT:        launch.FileRunner(dhtDefaults, selectProcess, runDHTRole),
		launch.RoleServer:     launch.FileRunner(serverDefaults, selectProcess, runServerRole),
		launch.RoleMoETrainer: launch.FileRunner(moeTrainerDefaults, selectProcess, runMoETrainerRole),
		launch.RolePipeline:   runPipelineFile,
	}
}

// roleHost checks a role's network and process options, naming their
// flags, and returns its host's configuration (with a memory budget, it
// sets the process's soft memory limit).
func roleHost(n launch.Net, p launch.Process) (p2p.Config, error) {
	if err := p.Check(); err != nil {
		return p2p.Config{}, flagError(err)
	}
	net := connectFlags{n}
	if _, err := net.seeds(); err != nil {
		return p2p.Config{}, err
	}
	return net.config()
}

// runRoleFile runs `skyhive @FILE`: the role the config file at path
// names, with its config.
func runRoleFile(ctx context.Context, path string, stdout, stderr io.Writer) error {
	return launch.RunFile(ctx, path, stdout, stderr, roles())
}

// selectProcess applies a config's process options that the root command's
// flags set otherwise: the GEMM backend.
func selectProcess(p launch.Process) error {
	return selectGEMM(cmp.Or(p.GEMM, "auto"))
}

// durationVar lets a flag set a launch.Duration.
func durationVar(d *launch.Duration) *time.Duration { return (*time.Duration)(d) }
