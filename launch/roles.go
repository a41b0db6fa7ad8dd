package launch

// Role names: a config file's "role", and what each config's Role returns.
const (
	RolePeer = "peer" // an averaging peer (skyhive peer)
)

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
	Relays       []string `json:"relays,omitempty"`
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
	// MemoryMiB is the process's memory budget (0: none).
	MemoryMiB int64 `json:"memory_budget_mib,omitempty"`
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
	// OuterMomentum 0 takes the default; optimizer.NoMomentum is none.
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
