package swarm

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/skyhive/skyhive/launch"
	"github.com/skyhive/skyhive/netem"
	"github.com/skyhive/skyhive/p2p"
	"github.com/skyhive/skyhive/p2p/admission"
)

// RunConfig configures Run.
type RunConfig struct {
	// Binary is the skyhive executable every peer runs.
	Binary string
	// Dir receives each peer's NAME.log (stderr), NAME.out (stdout: its
	// result), NAME.key (its identity), the swarm's files and the run's
	// chart, summary.png (WriteSummaryPNG). It is created if needed.
	Dir string
	// Env is added to every peer's environment.
	Env []string
	// Isolation and Timeout, when set, override the spec's.
	Isolation string
	Timeout   time.Duration
	// Log receives progress lines (nil discards them).
	Log io.Writer
	// StopTimeout is how long a stopped peer may take to exit before it is
	// killed (default 15 s).
	StopTimeout time.Duration
}

// RunResult is what a Run measured.
type RunResult struct {
	Name      string  `json:"name"`
	Isolation string  `json:"isolation"`
	Seconds   float64 `json:"seconds"`
	// Peers are in index order.
	Peers  []PeerResult `json:"peers"`
	Events []Event      `json:"events,omitempty"`
	// Network counts the namespace router's packets (namespaces only).
	Network *netem.TopologyStats `json:"network,omitempty"`
	// TimedOut is set when the spec's timeout stopped the run.
	TimedOut bool `json:"timed_out,omitempty"`
}

// PeerResult is one peer of a Run.
type PeerResult struct {
	Name   string `json:"name"`
	Class  string `json:"class"`
	Role   string `json:"role"`
	Region string `json:"region,omitempty"`
	NAT    bool   `json:"nat,omitempty"`
	// Stranger is set for peers left out of a closed swarm.
	Stranger bool `json:"stranger,omitempty"`
	// Addr is the multiaddr the peer listened on, with its peer ID.
	Addr   string `json:"addr"`
	State  string `json:"state"`
	Error  string `json:"error,omitempty"`
	Starts int    `json:"starts"`
	// Sent and Received are the IP bytes through the namespace router.
	Sent     uint64 `json:"bytes_sent,omitempty"`
	Received uint64 `json:"bytes_received,omitempty"`
	// Result is the last JSON value the peer printed on stdout (--json),
	// absent for services and peers killed before they finished.
	Result json.RawMessage `json:"result,omitempty"`
	// TestAccuracy is Result's test_accuracy, if it has one.
	TestAccuracy *float64 `json:"test_accuracy,omitempty"`
	// Log is the path of the peer's stderr.
	Log string `json:"log"`
}

// listenPort is every peer's TCP port inside its own namespace.
const listenPort = 4001

// runPeer is a peer's place in the swarm, fixed before anything starts.
type runPeer struct {
	spec PeerSpec
	id   peer.ID
	key  string
	ip   string
	port int
}

func (r runPeer) addr() string {
	return fmt.Sprintf("/ip4/%s/tcp/%d/p2p/%s", r.ip, r.port, r.id)
}

// namespaces is what Run uses of netem.Topology.
type namespaces interface {
	Namespace(id peer.ID) (string, bool)
	Do(id peer.ID, fn func() error) error
	Stats() netem.TopologyStats
	PeerBytes(id peer.ID) (sent, received uint64, ok bool)
	Close() error
}

// RunFile runs the spec in the file at path (LoadSpec, then Run): a spec
// with no name takes the file's, and with no cfg.Dir the run keeps its
// files in results/swarm-NAME.
func RunFile(ctx context.Context, path string, cfg RunConfig) (*RunResult, error) {
	spec, err := LoadSpec(path)
	if err != nil {
		return nil, err
	}
	if spec.Name == "" {
		spec.Name = strings.TrimSuffix(filepath.Base(path), filepath.Ext(path))
	}
	if cfg.Dir == "" {
		cfg.Dir = filepath.Join("results", "swarm-"+spec.Name)
	}
	return Run(ctx, spec, cfg)
}

// Run starts the swarm a spec describes as separate skyhive processes,
// each in its own network namespace joined by netem's router (as root) or
// on loopback, fires the failure schedule, waits until every peer that
// ends by itself (trainers, averaging peers, the pipeline coordinator) has
// ended, stops the services (DHT nodes, relays, expert servers, workers)
// and returns each peer's result, also drawn in Dir/summary.png
// (WriteSummaryPNG). It leaves nothing running: peers die with
// this process (Pdeathsig) and the namespaces are deleted on return (or by
// the next run, if this process was killed).
func Run(ctx context.Context, spec *Spec, cfg RunConfig) (*RunResult, error) {
	if err := spec.Validate(); err != nil {
		return nil, err
	}
	if cfg.Binary == "" || cfg.Dir == "" {
		return nil, errors.New("swarm: run needs the skyhive binary and a directory")
	}
	if cfg.StopTimeout <= 0 {
		cfg.StopTimeout = 15 * time.Second
	}
	iso, err := chooseIsolation(spec, cfg.Isolation)
	if err != nil {
		return nil, err
	}
	timeout := cmp.Or(cfg.Timeout, spec.Timeout, DefaultTimeout)
	rps, err := runPeers(spec, cfg.Dir)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	net_, ns, err := isolate(ctx, spec, iso, rps, cfg.logf)
	if err != nil {
		return nil, err
	}
	if ns != nil {
		defer ns.Close()
	}
	byName := map[string]runPeer{}
	for _, rp := range rps {
		byName[rp.spec.Name] = rp
	}
	pr, err := runProcesses(spec, cfg, rps, byName, ns)
	if err != nil {
		return nil, err
	}
	cfg.logf("swarm %s: %d peers, isolation %s, logs in %s", cmp.Or(spec.Name, "(unnamed)"), len(rps), iso, cfg.Dir)
	sw, err := Start(ctx, spec, pr, Options{Network: net_, StopTimeout: cfg.StopTimeout})
	if err != nil {
		return nil, err
	}
	for _, p := range sw.Peers() {
		if err := p.Register(byName[p.Name].id); err != nil {
			sw.Stop()
			return nil, err
		}
	}
	res := &RunResult{Name: spec.Name, Isolation: iso}
	res.TimedOut = !waitFinite(ctx, sw, timeout, cfg.logf)
	stopErr := sw.Stop()
	collectResults(res, sw, rps, byName, ns, cfg.Dir)
	// The chart is a view of the result: failing to draw it is reported,
	// not the run's error.
	if err := WriteSummaryPNG(filepath.Join(cfg.Dir, SummaryFile), res); err != nil {
		cfg.logf("swarm %s: summary chart: %v", cmp.Or(spec.Name, "(unnamed)"), err)
	} else {
		cfg.logf("swarm %s: summary chart in %s", cmp.Or(spec.Name, "(unnamed)"), filepath.Join(cfg.Dir, SummaryFile))
	}
	return res, runError(ctx, spec, cfg.Dir, timeout, res, stopErr)
}

// logf writes a line to cfg.Log, if set.
func (cfg *RunConfig) logf(format string, args ...any) {
	if cfg.Log != nil {
		fmt.Fprintf(cfg.Log, format+"\n", args...)
	}
}

// runPeers are the spec's peers in start order, each with its identity
// (a key file in dir, created if missing), so that every address is known
// before anything starts.
func runPeers(spec *Spec, dir string) ([]runPeer, error) {
	peers := spec.Peers()
	if err := checkOrder(peers); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("swarm: %w", err)
	}
	rps := make([]runPeer, len(peers))
	for i, ps := range peers {
		rp := runPeer{spec: ps, key: filepath.Join(dir, ps.Name+".key")}
		var err error
		if rp.id, err = identity(rp.key); err != nil {
			return nil, err
		}
		rps[i] = rp
	}
	return rps, nil
}

// isolate gives every peer of rps its address: with namespaces, one of
// its own in a network namespace linked by the spec's emulated network
// (which it returns with the namespaces; close them when done); else a
// free port on loopback, and no network.
func isolate(ctx context.Context, spec *Spec, iso string, rps []runPeer, logf func(string, ...any)) (*netem.Network, namespaces, error) {
	if iso != IsolationNamespaces {
		for i := range rps {
			var err error
			if rps[i].port, err = freePort(); err != nil {
				return nil, nil, err
			}
			rps[i].ip = "127.0.0.1"
		}
		if spec.Profile != nil {
			logf("isolation processes: every peer on loopback; the network's links are not emulated (run as root for namespaces)")
		}
		return nil, nil, nil
	}
	profile := spec.Profile
	if profile == nil {
		profile = netem.Uniform(netem.LinkParams{})
	}
	net_, err := netem.New(profile, spec.Seed)
	if err != nil {
		return nil, nil, err
	}
	ids := make([]peer.ID, len(rps))
	var nat []peer.ID
	for i, rp := range rps {
		ids[i] = rp.id
		region := rp.spec.Region
		if region == "" {
			region = profile.Regions[0]
		}
		if err := net_.Assign(rp.id, region); err != nil {
			return nil, nil, err
		}
		if rp.spec.NAT {
			nat = append(nat, rp.id)
		}
	}
	ns, err := newNamespaces(ctx, net_, ids, nat)
	if err != nil {
		return nil, nil, fmt.Errorf("swarm: isolation namespaces: %w", err)
	}
	for i := range rps {
		rps[i].ip = fmt.Sprintf("10.77.0.%d", i+1)
		rps[i].port = listenPort
	}
	return net_, ns, nil
}

// runProcesses is how the run starts its peers: the skyhive binary with
// each peer's role config (the swarm's secret for a closed swarm, one per
// run directory, so that a rejoining peer keeps it), ready once it
// listens, inside its namespace if ns is set.
func runProcesses(spec *Spec, cfg RunConfig, rps []runPeer, byName map[string]runPeer, ns namespaces) (*Processes, error) {
	secret := ""
	if spec.Closed {
		secret = filepath.Join(cfg.Dir, "swarm.secret")
		if err := admission.NewSwarmSecret(secret); err != nil && !errors.Is(err, fs.ErrExist) {
			return nil, err
		}
	}
	configOf, err := roleConfigs(rps, secret)
	if err != nil {
		return nil, err
	}
	pr := &Processes{
		Path: cfg.Binary, Dir: cfg.Dir, SplitStdout: true,
		Config: func(p *Peer) launch.Config { return configOf[p.Name] },
		Env:    func(*Peer) []string { return cfg.Env },
		Ready: func(ctx context.Context, p *Peer, exited <-chan struct{}) error {
			if !needsReady(p.Role) {
				return nil
			}
			return waitListening(ctx, byName[p.Name], ns, exited, filepath.Join(cfg.Dir, p.Name+".log"))
		},
	}
	if ns != nil {
		pr.Wrap = func(p *Peer) []string {
			name, _ := ns.Namespace(byName[p.Name].id)
			return []string{"ip", "netns", "exec", name}
		}
	}
	return pr, nil
}

// collectResults fills in res from the stopped swarm: its duration and
// events, the network's traffic, and every peer's state, addresses, bytes
// and final JSON result (from its .out file in dir).
func collectResults(res *RunResult, sw *Swarm, rps []runPeer, byName map[string]runPeer, ns namespaces, dir string) {
	rep := sw.Report()
	res.Seconds = rep.End.Sub(rep.Start).Seconds()
	res.Events = rep.Events
	if ns != nil {
		st := ns.Stats()
		res.Network = &st
	}
	for i, p := range sw.Peers() {
		rp := rps[i]
		st, perr := p.State()
		pres := PeerResult{
			Name: p.Name, Class: p.Class, Role: p.Role, Region: p.Region, NAT: p.NAT, Stranger: byName[p.Name].spec.Stranger,
			Addr: rp.addr(), State: st, Starts: p.Starts(), Log: filepath.Join(dir, p.Name+".log"),
		}
		if perr != nil {
			pres.Error = perr.Error() + lastLine(pres.Log)
		}
		if ns != nil {
			pres.Sent, pres.Received, _ = ns.PeerBytes(rp.id)
		}
		if v, ok := lastJSON(filepath.Join(dir, p.Name+".out")); ok {
			pres.Result = v
			var acc struct {
				TestAccuracy *float64 `json:"test_accuracy"`
			}
			if json.Unmarshal(v, &acc) == nil {
				pres.TestAccuracy = acc.TestAccuracy
			}
		}
		res.Peers = append(res.Peers, pres)
	}
}

// runError is the run's outcome: ctx's end, the timeout, or the peers
// that failed (a run where only strangers failed succeeded: the swarm
// refused them).
func runError(ctx context.Context, spec *Spec, dir string, timeout time.Duration, res *RunResult, stopErr error) error {
	switch {
	case ctx.Err() != nil:
		return ctx.Err()
	case res.TimedOut:
		return fmt.Errorf("swarm: %s did not finish within %v (raise \"timeout\" or shorten the training)", cmp.Or(spec.Name, "the swarm"), timeout)
	}
	if stopErr == nil {
		return nil
	}
	failed := res.failed()
	if len(failed) == 0 && slices.ContainsFunc(res.Peers, func(p PeerResult) bool { return p.Stranger && p.State == StateFailed }) {
		return nil // only strangers failed: the swarm refused them
	}
	if len(failed) > 0 {
		return &PeersFailedError{Dir: dir, Peers: failed, err: stopErr}
	}
	return stopErr
}

// PeersFailedError is Run's error when peers failed: each failed peer with
// its error and the last line of its log.
type PeersFailedError struct {
	// Dir holds the peers' logs.
	Dir string
	// Peers are the failed peers' results.
	Peers []PeerResult
	err   error
}

func (e *PeersFailedError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "swarm: %d peer(s) failed (logs in %s):", len(e.Peers), e.Dir)
	for _, p := range e.Peers {
		fmt.Fprintf(&b, "\n  %s: %s", p.Name, p.Error)
	}
	return b.String()
}

// Unwrap returns the peers' errors, joined.
func (e *PeersFailedError) Unwrap() error { return e.err }

// failed returns the peers that failed, but the strangers (whose failure
// a closed swarm expects).
func (r *RunResult) failed() []PeerResult {
	var out []PeerResult
	for _, p := range r.Peers {
		if p.State == StateFailed && !p.Stranger {
			out = append(out, p)
		}
	}
	return out
}

// chooseIsolation resolves the isolation mode: namespaces when the spec or
// the caller asks for them (an error if they cannot run here) or, when
// neither says, when they can run.
func chooseIsolation(spec *Spec, override string) (string, error) {
	iso := cmp.Or(override, spec.Isolation)
	nsErr := netem.NamespaceSupport()
	nat := slices.ContainsFunc(spec.Devices, func(c DeviceClass) bool { return c.NAT })
	switch iso {
	case "":
		if nsErr != nil {
			if nat {
				return "", fmt.Errorf("swarm: peers behind a NAT need network namespaces: %w", nsErr)
			}
			return IsolationProcesses, nil
		}
		return IsolationNamespaces, nil
	case IsolationNamespaces:
		if nsErr != nil {
			return "", fmt.Errorf("swarm: isolation namespaces: %w (or use isolation processes)", nsErr)
		}
		return iso, nil
	case IsolationProcesses:
		if nat {
			return "", errors.New(`swarm: peers behind a NAT ("nat": true) need isolation namespaces`)
		}
		return iso, nil
	}
	return "", fmt.Errorf("swarm: isolation %q: want %q or %q", iso, IsolationNamespaces, IsolationProcesses)
}

// checkOrder requires the classes others join through to come first:
// each class starts once the ones before it listen.
func checkOrder(peers []PeerSpec) error {
	seen := map[string]bool{}
	for _, p := range peers {
		var need []string
		switch p.Role {
		case RoleServer, RoleTrainer, RolePeer:
			if !seen[RoleDHT] && !seen[RoleRelay] {
				need = []string{RoleDHT, RoleRelay}
			}
		case RoleWorker:
			if !seen[RoleCoordinator] {
				need = []string{RoleCoordinator}
			}
		}
		if p.NAT && !seen[RoleRelay] {
			need = []string{RoleRelay}
		}
		if need != nil {
			return fmt.Errorf("swarm: spec: class %q (role %s) is listed before a %s class; list the classes others join through first", p.Class, p.Role, strings.Join(need, " or "))
		}
		seen[p.Role] = true
	}
	return nil
}

// roleConfigs returns every peer's config: its class's, with the fields
// that connect it set; secret, if set, closes the swarm to all but the
// strangers.
func roleConfigs(rps []runPeer, secret string) (map[string]launch.Config, error) {
	var seeds, relays []string
	var coord string
	workers := 0
	for _, rp := range rps {
		switch rp.spec.Role {
		case RoleDHT:
			seeds = append(seeds, rp.addr())
		case RoleRelay:
			seeds = append(seeds, rp.addr())
			relays = append(relays, rp.addr())
		case RoleCoordinator:
			coord = rp.addr()
		case RoleWorker:
			if !rp.spec.Stranger {
				workers++
			}
		}
	}
	out := map[string]launch.Config{}
	for _, rp := range rps {
		p := rp.spec
		cfg := p.Config
		if cfg == nil {
			cfg = roleConfig(p.Role)
		}
		net, proc := connect(cfg, p, seeds, coord, workers)
		if net == nil {
			return nil, fmt.Errorf("swarm: %s: no config for role %q", p.Name, p.Role)
		}
		if p.Region != "" && p.Role != RoleCoordinator {
			// Workers plan by region; the others show it in their status records.
			proc.Region = p.Region
		}
		net.Listen, net.Identity = []string{fmt.Sprintf("/ip4/%s/tcp/%d", rp.ip, rp.port)}, rp.key
		if p.NAT {
			net.Relays, net.Reachability = relays, "private"
		}
		if secret != "" && !p.Stranger {
			net.SwarmSecret = secret
		}
		out[p.Name] = cfg
	}
	return out, nil
}

// connect sets the role-specific fields of cfg, a pointer to the config of
// peer p's role, that join it to the swarm, and returns its network and
// process options for the fields every role has (nil for a config of no
// role).
func connect(cfg launch.Config, p PeerSpec, seeds []string, coord string, workers int) (*launch.Net, *launch.Process) {
	slow := 0.0
	if p.Slowdown != 1 {
		slow = p.Slowdown
	}
	switch c := cfg.(type) {
	case *launch.DHT:
		if p.Role == RoleRelay {
			c.RelayService, c.Reachability = true, "public"
		}
		return &c.Net, &c.Process
	case *launch.Server:
		c.DHT = seeds
		return &c.Net, &c.Process
	case *launch.MoETrainer:
		c.DHT, c.JSON = seeds, true
		return &c.Net, &c.Process
	case *launch.Peer:
		c.DHT, c.JSON, c.Quiet = seeds, true, true
		if slow != 0 {
			c.Slowdown = slow
		}
		return &c.Net, &c.Process
	case *launch.Pipeline:
		// The DHT only to publish its status record (skyhive status, dashboard).
		c.JoinWait, c.JSON, c.DHT = workers, true, seeds
		return &c.Net, &c.Process
	case *launch.Worker:
		c.Join, c.Name = coord, p.Name
		if slow != 0 {
			c.Slowdown = slow
		}
		return &c.Net, &c.Process
	}
	return nil, nil
}

// needsReady tells whether a role's peer must listen before the next one
// starts: the ones others join through.
func needsReady(role string) bool {
	return role == RoleDHT || role == RoleRelay || role == RoleCoordinator
}

// waitListening waits until rp accepts TCP connections (from inside its
// namespace when there is one), or fails if the process exits first.
func waitListening(ctx context.Context, rp runPeer, ns namespaces, exited <-chan struct{}, log string) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	addr := net.JoinHostPort(rp.ip, strconv.Itoa(rp.port))
	dial := func() error {
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err == nil {
			c.Close()
		}
		return err
	}
	t := time.NewTicker(50 * time.Millisecond)
	defer t.Stop()
	for {
		var err error
		if ns != nil {
			err = ns.Do(rp.id, dial)
		} else {
			err = dial()
		}
		if err == nil {
			return nil
		}
		select {
		case <-exited:
			return fmt.Errorf("%s exited before listening on %s%s", rp.spec.Name, addr, lastLine(log))
		case <-ctx.Done():
			return fmt.Errorf("%s did not listen on %s within 30s%s", rp.spec.Name, addr, lastLine(log))
		case <-t.C:
		}
	}
}

// waitFinite waits until every peer that ends by itself has ended with no
// restart pending. It reports false if the timeout came first.
func waitFinite(ctx context.Context, sw *Swarm, timeout time.Duration, logf func(string, ...any)) bool {
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	tick := time.NewTicker(250 * time.Millisecond)
	defer tick.Stop()
	finite := 0
	for _, p := range sw.Peers() {
		if !IsService(p.Role) {
			finite++
		}
	}
	last := -1
	for {
		left := 0
		for _, p := range sw.Peers() {
			if IsService(p.Role) {
				continue
			}
			st, _ := p.State()
			if st == StatePending || st == StateRunning || p.startsLeft() > 0 {
				left++
			}
		}
		if left != last {
			logf("%d of %d training peers running", left, finite)
			last = left
		}
		if left == 0 {
			return true
		}
		select {
		case <-ctx.Done():
			return true
		case <-deadline.C:
			return false
		case <-sw.Done():
		case <-tick.C:
		}
	}
}

// identity creates (or reads) a peer's key file and returns its ID.
func identity(path string) (peer.ID, error) {
	key, err := p2p.LoadOrCreateIdentity(path)
	if err != nil {
		return "", fmt.Errorf("swarm: identity %s: %w", path, err)
	}
	id, err := peer.IDFromPrivateKey(key)
	if err != nil {
		return "", fmt.Errorf("swarm: identity %s: %w", path, err)
	}
	return id, nil
}

// freePort asks the kernel for a free loopback TCP port. Another process
// could take it before the peer listens; the peer then fails to start
// with a "port in use" error.
func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("swarm: finding a free port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// lastJSON returns the last JSON value in a file of JSON values (lines or
// indented objects), skipping a truncated tail.
func lastJSON(path string) (json.RawMessage, bool) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, false
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	var last json.RawMessage
	for {
		var v json.RawMessage
		if dec.Decode(&v) != nil {
			break
		}
		last = v
	}
	return last, last != nil
}

// lastLine returns ": " and the last non-empty line of a log, for errors.
func lastLine(path string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	if l := strings.TrimSpace(lines[len(lines)-1]); l != "" {
		return fmt.Sprintf(" (%s: %s)", filepath.Base(path), l)
	}
	return ""
}
