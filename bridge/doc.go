// Package bridge is the daemon role that PyTorch training loops run under:
// `skyhive daemon` listens on a Unix socket only its user can open, and a
// client (the Python package skyhive, python/skyhive) describes its
// model's parameters, receives a shared-memory region that holds them and
// their gradients in float32, and then calls Step after each backward
// pass. The daemon joins the swarm (package node: host, DHT, admission,
// NAT traversal) as an averaging peer (averaging/peer.Attach) and runs the
// averaging optimizer (averaging/optimizer) over the region's tensors; the
// client's own optimizer (torch.optim) is the optimizer it wraps: when the
// algorithm takes a local step, the daemon asks the client to take it
// (the "inner_step" call) and reads the parameters back.
//
// The protocol is framed JSON: a 4-byte big-endian length, then one JSON
// object of at most MaxMessageBytes. The region's file descriptor (a
// sealed memfd: it cannot shrink or grow, so the daemon's mapping can
// never fault) travels with the daemon's "shm" reply as SCM_RIGHTS
// ancillary data. A session:
//
//	client                              daemon
//	hello {version, params, options} ->
//	                                 <- shm {elements, bytes} + fd
//	(writes the initial parameters)
//	join                             ->
//	                                 <- joined {peer, addrs, round, donors}
//	(copies the parameters back: a joiner's come from the swarm)
//	step {samples}                   ->
//	                                 <- inner_step (zero or more times)
//	inner_done                       ->
//	                                 <- stepped {round, stats, progress}
//	close                            ->
//	                                 <- closed
//
// A client may instead open a MoE session (hello with mode "moe", the
// Python skyhive.RemoteMixtureOfExperts): the daemon joins the swarm's DHT
// as a client and, for each forward call, runs the beam search on the
// gate's scores the client wrote into the shared memory, calls the chosen
// experts (moe/client.Dispatch) and writes their answers back; a backward
// call sends the answers' gradients to the experts and writes the input's
// gradient.
//
// The package also runs executors (Executor, StartExecutor): a PyTorch
// child process of a role (python3 -m skyhive.executor) that builds the
// user's modules and runs their forward and backward passes and optimizer
// steps, reached over an inherited socket pair with this framing and a
// sealed memfd it inherits too. An expert server's executor builds one
// module per expert (Build, Forward, Backward); a pipeline worker's holds
// a stage, the PyTorch twins of a registry model's layers (StageModule,
// BuildStage, StageForward, StageBackward, StageStep, StageProfile).
//
// Everything the client sends is checked before the daemon allocates or
// maps: the protocol version, the number, names, shapes and total size of
// the parameters, the options (those of `skyhive peer` that concern the
// network and averaging), and, at every step, that no parameter or
// gradient holds NaN or infinity. A failed check is an "error" reply that
// names what to fix; the session goes on where it can.
package bridge
