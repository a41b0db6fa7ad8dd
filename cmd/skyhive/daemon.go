package main

import (
	"time"

	"github.com/spf13/cobra"

	"github.com/skyhive/skyhive/bridge"
)

func newDaemonCmd() *cobra.Command {
	var c bridge.Config
	cmd := &cobra.Command{
		Use:   "daemon",
		Short: "Serve PyTorch training loops: average their models with the swarm (the Python package skyhive)",
		Long: "Listen on a Unix socket that only this user can open and serve PyTorch training loops: the\n" +
			"Python package skyhive (python/, pip install ./python) connects, describes its model's\n" +
			"parameters and gives the options of `skyhive peer` that concern the network and averaging\n" +
			"(dht, run_id, algo, inner_steps, codec, ...). The daemon joins the swarm as an averaging peer\n" +
			"for that model, and the parameters and gradients cross through shared memory. skyhive.Optimizer\n" +
			"starts a daemon of its own (with --once) unless it is given a socket to attach to. See docs/pytorch.md.",
		Example: "  skyhive daemon                                  # listens on " + bridge.DefaultSocket() + "\n" +
			"  skyhive daemon --socket /run/user/1000/skyhive/gpu0.sock\n" +
			"  # then, in Python: skyhive.Optimizer(..., daemon=\"/run/user/1000/skyhive/gpu0.sock\")",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c.Log = cmd.ErrOrStderr()
			return bridge.Serve(cmd.Context(), c)
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&c.Socket, "socket", bridge.DefaultSocket(), "Unix socket to listen on (its directory is created with mode 0700)")
	fl.BoolVar(&c.Once, "once", false, "serve one session, then exit (and exit if no client connects within --accept-timeout)")
	fl.DurationVar(&c.AcceptTimeout, "accept-timeout", time.Minute, "with --once, how long to wait for the client")
	fl.IntVar(&c.MaxSessions, "max-sessions", 4, "sessions (training processes) served at once, each a peer of its own")
	return cmd
}
