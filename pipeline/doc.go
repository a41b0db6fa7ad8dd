// Package pipeline trains one model split into contiguous blocks of layers
// ("stages") over several workers: load-balanced pipeline model
// parallelism as in Sky Computing. Each worker holds its block and that
// block's optimizer state, activations go forward worker to worker,
// gradients come back, and every stage steps its own optimizer. When a
// worker slows down or dies, the coordinator re-plans and moves the layers,
// with their optimizer state, to the new owners. docs/pipeline.md has the
// protocol, the schedules and the measurements.
//
// # Roles
//
// A Coordinator accepts workers (NewCoordinator); Coordinator.Start
// profiles them, plans, and returns a Session, whose Step trains on one
// batch. A Worker (NewWorker, Run; `skyhive worker`) serves whatever stage
// the coordinator assigns. Both talk through a p2p.Transport: by default
// each starts its own libp2p host (*p2p.Host), and CoordinatorConfig.
// Transport and WorkerConfig.Transport accept any other, such as a
// p2p/memnet peer, on which the package's tests run. Activations travel over
// one stream per iteration and direction when the transport has streams
// (libp2p), one call per tensor otherwise (memnet).
//
// # Models
//
// A session trains any model of package models: an image classifier on
// data.Batch (Session.Step), or a GPT language model on text.Batch
// (Session.StepTokens), whose examples are sequences of token ids and
// whose last stage computes the per-token cross-entropy. DescribeModel
// says what one example of a spec is. Language models are built with an
// untied output head (nn.GPTConfig.Untied), since the embedding of stage
// 0 and the head of the last stage live in different processes.
//
// # Where things are
//
// Coordinator side:
//
//   - coordinator.go: registration, the worker table, calls to workers.
//   - session.go: SessionConfig, IterStats, Session and Start.
//   - calibrate.go: profiling workers and measuring links.
//   - plan.go: the allocation problem, choosing, predicting and installing
//     plans (apply).
//   - step.go: one iteration (two-phase: iter, then commit) and drift
//     checks; drift.go: the drift detector, a plain value.
//   - recover.go: failure handling and re-planning.
//   - state.go: snapshots, gathering state from stages, checkpoint files.
//   - predict.go: the cost model and the event simulator behind
//     Session.Predict.
//   - train.go: the training loop (Session.Train, Batches) and
//     Session.Evaluate; compare.go: planning with several strategies and
//     measuring the plans in turn (ComparePlans, MeasurePlans).
//
// Worker side:
//
//   - worker.go: configuration, lifecycle (register, heartbeats, Close).
//   - worker_profile.go: timing the model for the coordinator.
//   - worker_stage.go: installing a stage, commit, abort, fetch.
//   - executor.go: running one iteration's schedule; inbox.go: tensors
//     that arrived from neighbours; transport.go: how tensors leave.
//   - torchstage.go: a stage whose layers a PyTorch executor computes
//     (WorkerConfig.Executor, `skyhive worker --executor python`).
//
// Shared: proto.go (protocol IDs and messages), schedule.go (Sequential,
// GPipe, 1F1B), model.go (model specs), routes.go (the addresses peers
// reach each other at), emulate.go (netem proxies behind those addresses
// when CoordinatorConfig.Network emulates links), probe.go (link
// measurements). On memnet, links are emulated by the transport itself
// (memnet.WithLink). Starting local worker processes is package swarm's
// (swarm.LaunchPipelineWorkers); scenario.go puts a coordinator and its
// local worker processes together (Scenario: the commands, benchmarks
// and experiments that run a pipeline on one machine) and compares plans
// in one call (Session.Compare).
package pipeline
