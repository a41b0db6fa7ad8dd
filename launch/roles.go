package launch

// Role names: a config file's "role", and what each config's Role returns.
const (
	RolePeer       = "peer"           // an averaging peer (skyhive peer)
	RoleWorker     = "worker"         // a pipeline stage worker (skyhive worker)
	RoleDHT        = "dht"            // a DHT node (skyhive dht)
	RoleServer     = "server"         // a MoE expert server (skyhive server)
	RoleMoETrainer = "train-moe"      // a MoE trainer (skyhive train moe)
	RolePipeline   = "train-pipeline" // a pipeline coordinator (skyhive train pipeline)
)

// New returns a pointer to a zero config of the named role, or false if
// there is no such role.
func New(role string) (Config, bool) {
	switch role {
	case RolePeer:
		return &Peer{}, true
	case RoleWorker:
		return &Worker{}, true
	case RoleDHT:
		return &DHT{}, true
	case RoleServer:
		return &Server{}, true
	case RoleMoETrainer:
		return &MoETrainer{}, true
	case RolePipeline:
		return &Pipeline{}, true
	}
	return nil, false
}

// Net is how a role's process joins the network, as the connection flags
// of its command (--listen, --dht, --relay, ...) give it. Every role's
// config embeds it; a field left zero takes the flag's default.
type Net struct {
	// Listen and Announce are multiaddrs (default: all interfaces, free
	// ports; announce the listen addresses).
	Listen   []string `json:"listen,omitempty"`
	Announce []string `json:"announce,omitempty"`
	// Identity is a private key file, created if missing.
	Identity string `json:"identity,omitempty"`
	// DHT are the swarm's DHT peers to join (multiaddrs ending in
	// /p2p/ID).
	DHT []string `json:"dht,omitempty"`
	// Relays are circuit relays to reserve a slot on; RelayService relays
	// for others.
	Relays       []string `json:"relay,omitempty"`
	RelayService bool     `json:"relay_service,omitempty"`
	// HolePunching and AutoNAT are on by default; a file may turn them
	// off.
	HolePunching bool `json:"hole_punching,omitempty"`
	AutoNAT      bool `json:"autonat,omitempty"`
	// Reachability is auto (default), public or private.
	Reachability string `json:"reachability,omitempty"`
	// SwarmSecret, or SwarmKey and MemberToken, close the swarm (files).
	SwarmSecret string `json:"swarm_secret,omitempty"`
	SwarmKey    string `json:"swarm_key,omitempty"`
	MemberToken string `json:"member_token,omitempty"`
	// MemoryMiB is the process's memory budget in MiB (0: none).
	MemoryMiB int64 `json:"memory_budget,omitempty"`
	// PendingPerAddress bounds the call requests of one protocol this
	// process reads at once from one address (0: p2p's default, 128;
	// raise it when many honest peers share an address, as behind one
	// NAT).
	PendingPerAddress int `json:"pending_per_address,omitempty"`
}

// Process holds the options every long-running role's process has: its
// region and status record, its metrics endpoint and its GEMM backend.
type Process struct {
	// Region is the peer's network region, shown by skyhive status.
	Region string `json:"region,omitempty"`
	// StatusEvery is how often the record is published (left out: the
	// default; negative: never).
	StatusEvery Duration `json:"status_every,omitempty"`
	// Metrics serves Prometheus metrics on this address ("": none).
	Metrics string `json:"metrics,omitempty"`
	// GEMM is the GEMM backend: auto (default) or go.
	GEMM string `json:"gemm,omitempty"`
}

// Peer configures an averaging peer (`skyhive peer`; see averaging/peer).
// The fields are the command's flags; zero fields take their defaults,
// and Batch and LR zero take the model's (32 and 0.05 for image models, 16
// and 3e-3 for language models).
type Peer struct {
	Net
	Process

	RunID            string   `json:"run_id,omitempty"`
	Algo             string   `json:"algo,omitempty"`
	Matchmaking      string   `json:"matchmaking,omitempty"`
	GroupSize        int      `json:"group_size,omitempty"`
	Tau              int      `json:"tau,omitempty"`
	Period           int      `json:"period,omitempty"`
	RoundInterval    Duration `json:"round_interval,omitempty"`
	InnerSteps       int      `json:"inner_steps,omitempty"`
	WarmupInnerSteps int      `json:"warmup_inner_steps,omitempty"`
	OuterLR          float64  `json:"outer_lr,omitempty"`
	// OuterMomentum 0 or optimizer.NoMomentum (-1) is none, as the
	// flag's 0; since Write leaves a zero out, which then takes the
	// default, a launcher writes NoMomentum for none.
	OuterMomentum   float64  `json:"outer_momentum,omitempty"`
	Fragments       int      `json:"fragments,omitempty"`
	OverlapSteps    int      `json:"overlap_steps,omitempty"`
	Codec           string   `json:"codec,omitempty"`
	Aggregation     string   `json:"aggregation,omitempty"`
	MaxNormRatio    float64  `json:"max_norm_ratio,omitempty"`
	MinAgree        int      `json:"min_agree,omitempty"`
	Timeout         Duration `json:"timeout,omitempty"`
	MinPeers        int      `json:"min_peers,omitempty"`
	WaitPeers       Duration `json:"wait_peers,omitempty"`
	JoinTimeout     Duration `json:"join_timeout,omitempty"`
	TargetBatchSize int64    `json:"target_batch_size,omitempty"`

	Model    string  `json:"model,omitempty"`
	Seed     uint64  `json:"seed,omitempty"`
	Batch    int     `json:"batch,omitempty"`
	LR       float64 `json:"lr,omitempty"`
	Momentum float64 `json:"momentum,omitempty"`
	// DataDir, Limit, Shard ("K/N") and EvalExamples are for image
	// models.
	DataDir      string `json:"data_dir,omitempty"`
	Limit        int    `json:"limit,omitempty"`
	Shard        string `json:"shard,omitempty"`
	EvalExamples int    `json:"eval_examples,omitempty"`
	// Data ("": fashion-mnist for image models, gcide for language
	// models) and the rest are language-model options. Seq 0 is the
	// context the model spec gives, else the flag's default; for
	// CorpusBytes, Warmup, Clip and WeightDecay, 0 is the flag's default
	// and a negative value what the flag's 0 means (no bound, no warm-up,
	// no clipping, no decay).
	Data        string  `json:"data,omitempty"`
	Vocab       int     `json:"vocab,omitempty"`
	Seq         int     `json:"seq,omitempty"`
	CorpusBytes int64   `json:"corpus_bytes,omitempty"`
	TokenWidth  int     `json:"token_width,omitempty"`
	EvalTokens  int     `json:"eval_tokens,omitempty"`
	Warmup      int     `json:"warmup,omitempty"`
	Clip        float64 `json:"clip,omitempty"`
	WeightDecay float64 `json:"weight_decay,omitempty"`

	Steps           int      `json:"steps,omitempty"`
	Duration        Duration `json:"duration,omitempty"`
	EvalEvery       Duration `json:"eval_every,omitempty"`
	Slowdown        float64  `json:"slowdown,omitempty"`
	Checkpoint      string   `json:"checkpoint,omitempty"`
	CheckpointEvery Duration `json:"checkpoint_every,omitempty"`
	// Stats is a file for JSON stats lines every StatsEvery.
	Stats      string   `json:"stats,omitempty"`
	StatsEvery Duration `json:"stats_every,omitempty"`
	// JSON prints the final result as one JSON line on stdout; Quiet
	// turns the progress bar off.
	JSON  bool `json:"json,omitempty"`
	Quiet bool `json:"quiet,omitempty"`
}

// Role returns RolePeer.
func (Peer) Role() string { return RolePeer }

// Output is where a role writes its results: JSON on stdout, and a stats
// file of JSON lines.
type Output struct {
	JSON  bool   `json:"json,omitempty"`
	Stats string `json:"stats,omitempty"`
}

// Worker configures a pipeline stage worker (`skyhive worker`; see
// pipeline.WorkerConfig). Its fields are the command's flags; its Net has
// no DHT and its Process no StatusEvery.
type Worker struct {
	Net
	Process

	// Join is the coordinator's multiaddr (required); Name is shown in its
	// tables.
	Join string `json:"join,omitempty"`
	Name string `json:"name,omitempty"`
	// Slowdown emulates a slower device; Steady makes it steady.
	Slowdown float64 `json:"slowdown,omitempty"`
	Steady   bool    `json:"steady,omitempty"`
	// MemCap caps the memory of the assigned layers in bytes.
	MemCap    int64    `json:"mem_cap,omitempty"`
	Heartbeat Duration `json:"heartbeat,omitempty"`
	Verbose   bool     `json:"verbose,omitempty"`
	// Executor is "go" (the layers compute in Skyhive's Go models) or
	// "python" (in their PyTorch twins, by an executor on Device run by
	// the interpreter Python).
	Executor string `json:"executor,omitempty"`
	Python   string `json:"python,omitempty"`
	Device   string `json:"device,omitempty"`
}

// Role returns RoleWorker.
func (Worker) Role() string { return RoleWorker }

// DHT configures a DHT node (`skyhive dht`): Net.DHT are the nodes it
// joins (none: it starts a DHT); a relay has Net.RelayService.
type DHT struct {
	Net
	Process
	Output
	StatsEvery Duration `json:"stats_every,omitempty"`
}

// Role returns RoleDHT.
func (DHT) Role() string { return RoleDHT }

// Server configures a MoE expert server (`skyhive server`; see
// moe/server.RunRole); the fields are the command's flags. Lazy left out
// creates the experts lazily when they would take more than 1 GiB;
// QueueMemory 0 is the default, lowered to the memory plan's share under
// Net.MemoryMiB.
type Server struct {
	Net
	Process
	Output

	Experts         string   `json:"experts,omitempty"`
	ExpertType      string   `json:"expert_type,omitempty"`
	Hidden          int      `json:"hidden,omitempty"`
	Heads           int      `json:"heads,omitempty"`
	MinBatch        int      `json:"min_batch,omitempty"`
	MaxBatch        int      `json:"max_batch,omitempty"`
	BatchTimeout    Duration `json:"batch_timeout,omitempty"`
	ParallelBatches int      `json:"parallel_batches,omitempty"`
	LR              float64  `json:"lr,omitempty"`
	Clip            float64  `json:"clip,omitempty"`
	MaxSeqLen       int      `json:"max_seq_len,omitempty"`
	RequestMemory   int64    `json:"request_memory,omitempty"`
	QueueMemory     int64    `json:"queue_memory,omitempty"`
	StepRows        int      `json:"step_rows,omitempty"`
	ZeroInit        bool     `json:"zero_init,omitempty"`
	Seed            uint64   `json:"seed,omitempty"`
	// Executor is "go" (Skyhive's experts) or "python" (the experts
	// Module builds, computed by a PyTorch executor on Device, run by
	// the interpreter Python).
	Executor        string   `json:"executor,omitempty"`
	Module          string   `json:"module,omitempty"`
	Python          string   `json:"python,omitempty"`
	Device          string   `json:"device,omitempty"`
	Lazy            *bool    `json:"lazy,omitempty"`
	Checkpoint      string   `json:"checkpoint,omitempty"`
	CheckpointEvery Duration `json:"checkpoint_every,omitempty"`
	DeclareEvery    Duration `json:"declare_every,omitempty"`
	StatsEvery      Duration `json:"stats_every,omitempty"`
	MaxExperts      int      `json:"max_experts,omitempty"`
	Verbose         bool     `json:"verbose,omitempty"`
}

// Role returns RoleServer.
func (Server) Role() string { return RoleServer }

// Training holds the options of the AdamW training commands (train moe,
// train pipeline).
type Training struct {
	Epochs      int     `json:"epochs,omitempty"`
	Batch       int     `json:"batch,omitempty"`
	LR          float64 `json:"lr,omitempty"`
	WeightDecay float64 `json:"weight_decay,omitempty"`
	Warmup      int64   `json:"warmup,omitempty"`
	Seed        uint64  `json:"seed,omitempty"`
	Steps       int     `json:"steps,omitempty"`
	Clip        float64 `json:"clip,omitempty"`
	// Data is the data set; DataDir and Limit are Fashion-MNIST's, the
	// rest a language model's.
	Data        string `json:"data,omitempty"`
	DataDir     string `json:"data_dir,omitempty"`
	Limit       int    `json:"limit,omitempty"`
	CorpusBytes int64  `json:"corpus_bytes,omitempty"`
	Vocab       int    `json:"vocab,omitempty"`
	Seq         int    `json:"seq,omitempty"`
	TokenWidth  int    `json:"token_width,omitempty"`
	EvalTokens  int    `json:"eval_tokens,omitempty"`
	// Latency and Bandwidth emulate the links of the role's calls.
	Latency   Duration `json:"latency,omitempty"`
	Bandwidth float64  `json:"bandwidth,omitempty"`
}

// MoETrainer configures a MoE trainer (`skyhive train moe`; see
// moe/trainer.RunRole); the fields are the command's flags. Hidden 0 takes
// the experts' hidden size from their DHT records.
type MoETrainer struct {
	Net
	Process
	Output
	Training

	Grids            string   `json:"grids,omitempty"`
	Hidden           int      `json:"hidden,omitempty"`
	Heads            int      `json:"heads,omitempty"`
	KBest            int      `json:"k_best,omitempty"`
	KMin             int      `json:"k_min,omitempty"`
	ForwardTimeout   Duration `json:"forward_timeout,omitempty"`
	TimeoutAfterKMin Duration `json:"timeout_after_k_min,omitempty"`
	BackwardTimeout  Duration `json:"backward_timeout,omitempty"`
	Trainers         int      `json:"trainers,omitempty"`
	EvalLimit        int      `json:"eval_limit,omitempty"`
	DHTCache         Duration `json:"dht_cache,omitempty"`
	AllowZeroOutputs bool     `json:"allow_zero_outputs,omitempty"`
	MaxFailedSteps   float64  `json:"max_failed_steps,omitempty"`
}

// Role returns RoleMoETrainer.
func (MoETrainer) Role() string { return RoleMoETrainer }

// Pipeline configures a pipeline coordinator (`skyhive train pipeline`);
// the fields are the command's flags. Net.DHT, if set, is where it
// publishes its status record. Its Process has no Region (it has
// CoordinatorRegion).
type Pipeline struct {
	Net
	Process
	Output
	Training

	Model             string   `json:"model,omitempty"`
	Micro             int      `json:"micro,omitempty"`
	Schedule          string   `json:"schedule,omitempty"`
	Strategy          string   `json:"strategy,omitempty"`
	Plan              string   `json:"plan,omitempty"`
	Compare           string   `json:"compare,omitempty"`
	CompareRounds     int      `json:"compare_rounds,omitempty"`
	ReplanThreshold   float64  `json:"replan_threshold,omitempty"`
	IterTimeout       Duration `json:"iter_timeout,omitempty"`
	LogEvery          int      `json:"log_every,omitempty"`
	Checkpoint        string   `json:"checkpoint,omitempty"`
	CheckpointEvery   int      `json:"checkpoint_every,omitempty"`
	Resume            bool     `json:"resume,omitempty"`
	JoinWait          int      `json:"join_wait,omitempty"`
	Workers           int      `json:"workers,omitempty"`
	Slowdowns         string   `json:"slowdowns,omitempty"`
	SlowdownMax       float64  `json:"slowdown_max,omitempty"`
	MemCaps           string   `json:"mem_caps,omitempty"`
	Regions           string   `json:"regions,omitempty"`
	WorkerRegions     string   `json:"worker_regions,omitempty"`
	CoordinatorRegion string   `json:"coordinator_region,omitempty"`
	KillAt            int      `json:"kill_at,omitempty"`
	KillWorker        int      `json:"kill_worker,omitempty"`
	// Executor, Python and Device are the local workers' (Worker's).
	Executor string `json:"executor,omitempty"`
	Python   string `json:"python,omitempty"`
	Device   string `json:"device,omitempty"`
}

// Role returns RolePipeline.
func (Pipeline) Role() string { return RolePipeline }
