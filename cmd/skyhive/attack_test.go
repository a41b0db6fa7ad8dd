package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/skyhive/skyhive/averaging/peer"
	"github.com/skyhive/skyhive/hostile"
	"github.com/skyhive/skyhive/metrics"
)

const loopback = "/ip4/127.0.0.1/tcp/0"

// startListening starts `skyhive args...` and returns it with the first
// loopback address it prints and its output so far and to come (stdout and
// stderr).
func startListening(t *testing.T, args ...string) (*proc, string, *syncBuffer) {
	t.Helper()
	out := &syncBuffer{}
	p := startCLIWith(t, out, out, args...)
	re := regexp.MustCompile(`/ip4/127\.0\.0\.1/tcp/\d+/p2p/\w+`)
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		if a := re.FindString(out.String()); a != "" {
			return p, a, out
		}
		select {
		case <-p.done:
			t.Fatalf("%v exited: %v\n%s", args, p.err, tail(out.String()))
		default:
		}
	}
	t.Fatalf("%v printed no loopback address:\n%s", args, tail(out.String()))
	return nil, "", nil
}

// peakRSS is a live process's peak resident memory (VmHWM), in MiB.
func peakRSS(p *proc) (float64, error) {
	mib, err := vmHWM(p.cmd.Process.Pid)
	if err == nil {
		return mib, nil
	}
	// A victim that finished its work first: its peak from the kernel's
	// accounting of the child it was.
	select {
	case <-p.done:
		if ru, ok := p.cmd.ProcessState.SysUsage().(*syscall.Rusage); ok {
			return float64(ru.Maxrss) / 1024, nil
		}
	case <-time.After(2 * time.Second):
	}
	return 0, err
}

// vmHWM is the peak resident memory of a running process, in MiB.
func vmHWM(pid int) (float64, error) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "VmHWM:"); ok {
			kb, err := strconv.ParseFloat(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 64)
			return kb / 1024, err
		}
	}
	return 0, fmt.Errorf("no VmHWM in /proc/%d/status", pid)
}

// TestAttackProgram runs the hostile peer program, `skyhive attack`, from
// 8 identities against a swarm of real processes on loopback while they
// do honest work: a DHT node, an expert server that an honest `skyhive
// train moe` trains through, a closed expert server, three averaging peers
// training together, and a pipeline coordinator training with two
// workers. Every attack that is not absorbed must be refused (the program
// exits with an error otherwise), the honest work must finish with the
// accuracy it reaches without attack, and each victim's peak memory must
// stay within its --memory-budget.
func TestAttackProgram(t *testing.T) {
	if testing.Short() || raceEnabled {
		t.Skip("runs a swarm of 11 processes under attack for about a minute")
	}
	needFashionMNIST(t)
	dir := t.TempDir()
	secret := filepath.Join(dir, "swarm.secret")
	var out syncBuffer
	if err := runCLI(t.Context(), &out, "keygen", "secret", secret); err != nil {
		t.Fatal(err)
	}
	// Each victim's --memory-budget, in MiB: about 1.5 times its peak
	// without attack (the coordinator and the averaging peers hold the
	// data set; the coordinator peaks at 396 MiB without attack).
	budgets := map[string]int{"dht": 256, "server": 256, "peer": 512, "train": 640, "worker": 256}
	type victim struct {
		name   string
		p      *proc
		out    *syncBuffer
		budget int
		id     string // peer ID
	}
	var victims []victim
	var targets []string
	listen := func(name string, args ...string) victim {
		budget := budgets[args[0]]
		p, addr, out := startListening(t, append(args, "--memory-budget", strconv.Itoa(budget))...)
		v := victim{name, p, out, budget, addr[strings.LastIndex(addr, "/")+1:]}
		victims = append(victims, v)
		targets = append(targets, addr)
		return v
	}
	listen("dht", "dht", "--listen", loopback)
	dhtAddr := targets[0]
	listen("server", "server", "--dht", dhtAddr, "--listen", loopback, "--experts", "ffn.[0:4]", "--hidden", "64", "--declare-every", "2s")
	listen("closed server", "server", "--listen", loopback, "--experts", "ffn.[0:2]", "--hidden", "64", "--swarm-secret", secret)

	// Three averaging peers: WAGMA over the DHT.
	peerArgs := []string{"peer", "--dht", dhtAddr, "--listen", loopback, "--run-id", "attacked", "--min-peers", "3",
		"--round-interval", "1s", "--timeout", "2s", "--batch", "64", "--limit", "20000", "--eval-every", "5s", "--duration", "70s", "--json"}
	var peers []victim
	for i := range 3 {
		peers = append(peers, listen(fmt.Sprint("peer-", i), append(peerArgs, "--stats", filepath.Join(dir, fmt.Sprint("peer-", i, ".jsonl")))...))
	}

	// A pipeline: a coordinator waiting for two workers.
	coord := listen("coordinator", "train", "pipeline", "--listen", loopback, "--join-wait", "2", "--model", "mlp-small",
		"--limit", "20000", "--epochs", "6", "--batch", "128", "--iter-timeout", "15s", "--log-every", "50")
	coordAddr := targets[len(targets)-1]
	for i := range 2 {
		listen(fmt.Sprint("worker-", i), "worker", "--join", coordAddr, "--listen", loopback, "--name", fmt.Sprint("w", i))
	}

	// An honest trainer of the open server's experts.
	var trainOut syncBuffer
	trainer := startCLIWith(t, &trainOut, nil, "train", "moe", "--dht", dhtAddr, "--listen", loopback, "--grids", "ffn.4", "--hidden", "64",
		"--k-best", "2", "--epochs", "2", "--limit", "10000", "--batch", "64", "--eval-limit", "2000")

	// The attack.
	var report syncBuffer
	args := []string{"attack", "--identities", "8", "--rate", "150", "--slow-rate", "1", "--duration", "30s", "--json"}
	for _, a := range targets {
		args = append(args, "--target", a)
	}
	attacker := startCLI(t, &report, args...)
	attackErr := attacker.wait(t, 3*time.Minute)

	// The attack crowded the status key with long-lived records
	// (dht-crowd-key); skyhive status still shows every averaging peer.
	var status syncBuffer
	if err := runCLI(t.Context(), &status, "status", "--listen", loopback, "--dht", dhtAddr, "--json", "--timeout", "10s"); err != nil {
		t.Errorf("status after the attack: %v\n%s", err, status.String())
	} else {
		var rep metrics.StatusReport
		if err := json.Unmarshal([]byte(status.String()), &rep); err != nil {
			t.Errorf("status --json: %v", err)
		}
		shown := map[string]bool{}
		for _, s := range rep.Peers {
			shown[s.Peer] = true
		}
		for _, p := range peers {
			if !shown[p.id] {
				t.Errorf("skyhive status after the attack shows %d records but not %s", len(rep.Peers), p.name)
			}
		}
	}

	// Peak memory, read while every victim still runs.
	for _, v := range victims {
		mib, err := peakRSS(v.p)
		if err != nil {
			t.Errorf("%s: %v (it exited: %v)\n%s", v.name, err, v.p.err, tail(v.out.String()))
			continue
		}
		t.Logf("%s: peak RSS %.0f MiB (budget %d)", v.name, mib, v.budget)
		if mib > float64(v.budget) {
			t.Errorf("%s: peak RSS %.0f MiB over its --memory-budget %d MiB", v.name, mib, v.budget)
		}
	}

	var r hostile.Report
	if err := json.Unmarshal([]byte(report.String()), &r); err != nil {
		t.Fatalf("attack report: %v (exit %v)\n%s\n%s", err, attackErr, report.String(), tail(attacker.stderr.String()))
	}
	if attackErr != nil || len(r.Breaches) > 0 {
		t.Errorf("breaches %v (exit %v)\n%s", r.Breaches, attackErr, tail(attacker.stderr.String()))
	}
	roles := map[string]int{}
	names := map[string]string{}
	for _, v := range victims {
		names[v.id] = v.name
	}
	for _, tg := range r.Targets {
		t.Logf("%s is a %v (%s)", names[tg.ID], tg.Roles, tg.Note)
		if names[tg.ID] == "closed server" && !strings.Contains(tg.Note, "not admitted") {
			t.Errorf("the closed server told a stranger its experts: %+v", tg)
		}
		for _, role := range tg.Roles {
			roles[role]++
		}
	}
	for role, want := range map[string]int{hostile.RoleDHT: 5, hostile.RoleExpertServer: 2, hostile.RoleAveraging: 3, hostile.RoleCoordinator: 1, hostile.RoleWorker: 2} {
		if roles[role] < want {
			t.Errorf("the attacker took %d targets for %s, want %d: %+v", roles[role], role, want, r.Targets)
		}
	}
	for _, ft := range []hostile.FloodTally{r.Fast, r.Slow} {
		for name, a := range ft.ByAttack {
			t.Logf("%-44s sent %5d refused %5d held %3d n/a %4d accepted %5d", name, a.Sent, a.Refused, a.Unanswered, a.Inapplicable, a.Accepted)
			if a.Sent == 0 || (!a.Absorbed && a.Refused == 0) {
				t.Errorf("%s: sent %d, refused %d", name, a.Sent, a.Refused)
			}
		}
	}
	if len(r.Slow.ByAttack) < 4 {
		t.Errorf("slow senders ran against %d protocols", len(r.Slow.ByAttack))
	}

	// The honest work finished as well as it does without attack.
	if err := trainer.wait(t, 3*time.Minute); err != nil {
		t.Fatalf("train moe: %v\n%s", err, tail(trainer.stderr.String()))
	}
	acc := regexp.MustCompile(`test accuracy:? ([0-9.]+)%?`).FindAllStringSubmatch(trainOut.String(), -1)
	if len(acc) == 0 {
		t.Fatalf("train moe printed no accuracy:\n%s", tail(trainOut.String()))
	}
	t.Logf("train moe through the attacked server: %s", acc[len(acc)-1][0])
	if a, _ := strconv.ParseFloat(acc[len(acc)-1][1], 64); a < 75 {
		t.Errorf("train moe through the attacked server: %s\n%s\n%s", acc[len(acc)-1][0], tail(trainOut.String()), tail(trainer.stderr.String()))
	}
	for i, p := range peers {
		if err := p.p.wait(t, 2*time.Minute); err != nil {
			t.Fatalf("peer-%d: %v\n%s", i, err, tail(p.out.String()))
		}
		res, err := peer.ReadFinal(filepath.Join(dir, fmt.Sprint("peer-", i, ".jsonl")))
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("peer-%d: accuracy %.4f, %d groups, %d failures", i, res.TestAccuracy, res.Groups, res.Failures)
		if res.TestAccuracy < 0.82 || res.Groups < 5 {
			t.Errorf("peer-%d: accuracy %.4f in %d groups under attack", i, res.TestAccuracy, res.Groups)
		}
	}
	if err := coord.p.wait(t, 3*time.Minute); err != nil {
		t.Fatalf("coordinator: %v\n%s", err, tail(coord.out.String()))
	}
	m := regexp.MustCompile(`pipeline: .*test accuracy ([0-9.]+)%`).FindStringSubmatch(coord.out.String())
	if m == nil {
		t.Fatalf("the coordinator printed no result:\n%s", tail(coord.out.String()))
	}
	t.Logf("%s", m[0])
	if a, _ := strconv.ParseFloat(m[1], 64); a < 80 {
		t.Errorf("pipeline under attack: %s", m[0])
	}
}

// TestRosterSquatters runs `skyhive attack --squat-run` against two
// `skyhive peer` processes that train with DiLoCo over a fixed roster
// (rank matchmaking): one stranger copies the run's listing and model
// signature, answers the roster questions as a member would and holds
// every contribution it is sent; another only copies the listing. Before
// the roster's liveness check and agreement, the first peer exited ("lists
// 3 peers") and the other waited on a stranger; now both train to the
// end, leave out the one that does not answer, and drop the one that
// holds contributions after it missed their first all-reduces.
func TestRosterSquatters(t *testing.T) {
	if testing.Short() || raceEnabled {
		t.Skip("trains two peer processes beside two strangers for 30 s")
	}
	needFashionMNIST(t)
	dir := t.TempDir()
	_, dhtAddr := startDHTProcess(t)
	var report syncBuffer
	squat := startCLIWith(t, &report, &report, "attack", "--target", dhtAddr, "--listen", loopback, "--squat-run", "squatted",
		"--duration", "30s", "--json")
	waitFor(t, "the squatters to start", 20*time.Second, func() bool { return strings.Count(report.String(), "squatting") == 2 })

	const steps, inner = 60, 5
	peers := map[string]*proc{}
	for _, name := range []string{"a", "b"} {
		peers[name] = startCLI(t, nil, "peer", "--dht", dhtAddr, "--listen", loopback, "--run-id", "squatted",
			"--algo", "diloco", "--inner-steps", fmt.Sprint(inner), "--matchmaking", "ranks", "--min-peers", "2",
			"--timeout", "2s", "--steps", fmt.Sprint(steps), "--batch", "64", "--limit", "5000", "--eval-examples", "1000",
			"--json", "--quiet", "--stats", filepath.Join(dir, name+".jsonl"))
		if name == "a" {
			// Peers started by hand half a second apart: the member
			// squatter, which copies the first listing it sees, is
			// listed too before their roster settles.
			time.Sleep(500 * time.Millisecond)
		}
	}
	for name, p := range peers {
		if err := p.wait(t, 3*time.Minute); err != nil {
			t.Fatalf("peer %s: %v\n%s", name, err, tail(p.stderr.String()))
		}
		snaps, err := peer.ReadSnapshots(filepath.Join(dir, name+".jsonl"))
		if err != nil || len(snaps) == 0 {
			t.Fatalf("peer %s: no stats: %v", name, err)
		}
		r := snaps[len(snaps)-1]
		t.Logf("peer %s: %d steps, %d outer steps, %d dead, %d failed collectives, accuracy %.3f", name, r.Stats.Steps, r.Stats.OuterSteps, r.Stats.Dead, r.Stats.Failures, r.Accuracy)
		if r.Stats.Steps != steps || r.Stats.OuterSteps != steps/inner {
			t.Errorf("peer %s: %d steps and %d outer steps, want %d and %d", name, r.Stats.Steps, r.Stats.OuterSteps, steps, steps/inner)
		}
		if r.Stats.Failures >= steps/inner {
			t.Errorf("peer %s: %d of %d collectives failed: the squatter was never dropped", name, r.Stats.Failures, steps/inner)
		}
	}
	if err := squat.wait(t, 2*time.Minute); err != nil {
		t.Fatalf("attack: %v\n%s", err, tail(report.String()))
	}
	var tallies map[string]hostile.SquatTally
	out := report.String()
	if err := json.Unmarshal([]byte(out[strings.Index(out, "{"):]), &tallies); err != nil {
		t.Fatalf("attack report: %v\n%s", err, out)
	}
	t.Logf("squatters: %+v", tallies)
	if m := tallies["member"]; m.Questions == 0 || m.Signature == "" {
		t.Errorf("the member squatter took no part (%+v): the test attacked nothing", m)
	}
}
