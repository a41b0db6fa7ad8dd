package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/skyhive/skyhive/averaging/peer"
	"github.com/skyhive/skyhive/data"
)

// raceEnabled is set when the race detector is on (race_test.go).
var raceEnabled bool

// envAsCLI makes the test binary act as the skyhive command, so that tests
// can start real peer processes without building the binary.
const envAsCLI = "SKYHIVE_TEST_AS_CLI"

func TestMain(m *testing.M) {
	if os.Getenv(envAsCLI) == "1" {
		main()
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// proc is a skyhive child process started by a test.
type proc struct {
	cmd    *exec.Cmd
	stdout bytes.Buffer
	stderr bytes.Buffer
	done   chan struct{}
	err    error
}

// startCLI starts the test binary as `skyhive args...`.
func startCLI(t *testing.T, stdout io.Writer, args ...string) *proc {
	t.Helper()
	return startCLIWith(t, stdout, nil, args...)
}

// startCLIWith is startCLI that also copies stderr to a writer (which,
// unlike proc.stderr, may be read while the process runs).
func startCLIWith(t *testing.T, stdout, stderr io.Writer, args ...string) *proc {
	t.Helper()
	return startProgram(t, stdout, stderr, append([]string{os.Args[0]}, args...))
}

// startProgram starts argv, whose program is the test binary or runs it
// (as prlimit does), as startCLIWith does.
func startProgram(t *testing.T, stdout, stderr io.Writer, argv []string) *proc {
	t.Helper()
	p := &proc{done: make(chan struct{})}
	p.cmd = exec.Command(argv[0], argv[1:]...)
	p.cmd.Env = append(os.Environ(), envAsCLI+"=1")
	p.cmd.Stdout = &p.stdout
	if stdout != nil {
		p.cmd.Stdout = stdout
	}
	p.cmd.Stderr = &p.stderr
	if stderr != nil {
		p.cmd.Stderr = io.MultiWriter(&p.stderr, stderr)
	}
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { p.err = p.cmd.Wait(); close(p.done) }()
	t.Cleanup(func() {
		p.cmd.Process.Kill()
		<-p.done
	})
	return p
}

// wait waits up to d for the process to exit.
func (p *proc) wait(t *testing.T, d time.Duration) error {
	t.Helper()
	select {
	case <-p.done:
		return p.err
	case <-time.After(d):
		p.cmd.Process.Kill()
		<-p.done
		t.Fatalf("%v still running after %v; stderr:\n%s", p.cmd.Args[1:], d, tail(p.stderr.String()))
		return nil
	}
}

func tail(s string) string {
	if len(s) > 3000 {
		return "..." + s[len(s)-3000:]
	}
	return s
}

// startDHTProcess starts `skyhive dht` on loopback and returns its address.
func startDHTProcess(t *testing.T) (*proc, string) {
	t.Helper()
	r, w := io.Pipe()
	p := startCLI(t, w, "dht", "--listen", "/ip4/127.0.0.1/tcp/0")
	addr := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(r)
		for sc.Scan() {
			if l := strings.TrimSpace(sc.Text()); strings.Contains(l, "/p2p/") {
				select {
				case addr <- l:
				default:
				}
			}
		}
	}()
	t.Cleanup(func() { w.Close() })
	select {
	case a := <-addr:
		return p, a
	case <-time.After(20 * time.Second):
		t.Fatalf("dht printed no address; stderr:\n%s", p.stderr.String())
	}
	return nil, ""
}

func needFashionMNIST(t *testing.T) {
	t.Helper()
	if _, err := os.Stat(filepath.Join(data.DefaultDir, "t10k-labels-idx1-ubyte.gz")); err != nil {
		t.Skipf("Fashion-MNIST not installed (scripts/setup.sh): %v", err)
	}
}

// TestPeerProcessesTrainTogether is the multi-process test of group
// averaging: a `skyhive dht` and 4 `skyhive peer` processes on loopback
// train Fashion-MNIST with WAGMA; one is killed with SIGKILL mid-run and one
// starts late and downloads the swarm's state. Meanwhile peers with an
// unreachable DHT, a wrong run ID and another model fail with errors that
// say so, and the swarm does not notice them.
func TestPeerProcessesTrainTogether(t *testing.T) {
	if testing.Short() || raceEnabled {
		// Under the race detector the peers train 5-10x slower and cannot
		// reach the accuracy in time; TestPeerLeavesCleanlyAndResumes runs
		// the same peer code in race-instrumented child processes.
		t.Skip("trains for about a minute with 5 processes")
	}
	needFashionMNIST(t)
	dir := t.TempDir()
	_, dhtAddr := startDHTProcess(t)
	const timeout = 2 * time.Second
	common := []string{"peer", "--dht", dhtAddr, "--listen", "/ip4/127.0.0.1/tcp/0", "--round-interval", "1s",
		"--timeout", timeout.String(), "--eval-every", "3s", "--batch", "64", "--json", "--quiet", "--run-id", "e2e",
		"--target-batch-size", "100000", "--stats-every", "500ms"}
	start := time.Now()
	const total = 55 * time.Second
	peers := map[string]*proc{}
	for _, name := range []string{"a", "b", "c", "killed"} {
		args := append(append([]string{}, common...), "--duration", total.String(), "--min-peers", "4",
			"--stats", filepath.Join(dir, name+".jsonl"))
		peers[name] = startCLI(t, nil, args...)
	}

	// Bad input, while the swarm trains.
	var wg sync.WaitGroup
	bad := func(name, want string, args ...string) {
		wg.Go(func() {
			p := startCLI(t, nil, args...)
			err := p.wait(t, 40*time.Second)
			var ee *exec.ExitError
			if !errors.As(err, &ee) || !strings.Contains(p.stderr.String(), want) {
				t.Errorf("%s: exit %v, stderr does not say %q:\n%s", name, err, want, tail(p.stderr.String()))
			}
		})
	}
	stats := func(name string) string { return filepath.Join(dir, name+".jsonl") }
	groups := func(name string) int {
		snaps, _ := peer.ReadSnapshots(stats(name))
		if len(snaps) == 0 {
			return -1
		}
		return snaps[len(snaps)-1].Stats.Groups
	}
	// The bad peers arrive once the swarm trains.
	waitFor(t, "the four peers to average", 40*time.Second, func() bool {
		return groups("a") >= 1 && groups("b") >= 1 && groups("c") >= 1 && groups("killed") >= 1
	})
	unreachable := "/ip4/127.0.0.1/tcp/1/p2p/" + strings.TrimPrefix(dhtAddr[strings.LastIndex(dhtAddr, "/p2p/"):], "/p2p/")
	bad("unreachable DHT", "cannot join the DHT", "peer", "--dht", unreachable, "--listen", "/ip4/127.0.0.1/tcp/0", "--join-timeout", "3s", "--quiet")
	bad("wrong run ID", "--run-id", append(append([]string{}, common...), "--run-id", "e2e-typo", "--wait-peers", "5s")...)
	bad("other model", "model", append(append([]string{}, common...), "--model", "mlp", "--wait-peers", "10s")...)
	bad("unknown aggregation", "--aggregation: averaging: unknown aggregation \"median\"", "peer", "--dht", dhtAddr, "--aggregation", "median", "--quiet")

	// One peer dies without warning after a few groups; the late one
	// joins once the others have averaged again without it.
	waitFor(t, "the peers to average in 3 groups", 40*time.Second, func() bool {
		return groups("a") >= 3 && groups("b") >= 3 && groups("c") >= 3
	})
	if err := peers["killed"].cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	killedAt := time.Since(start)
	ga, gb, gc := groups("a"), groups("b"), groups("c")
	waitFor(t, "the survivors to average twice more", 40*time.Second, func() bool {
		return groups("a") >= ga+2 && groups("b") >= gb+2 && groups("c") >= gc+2
	})
	lateArgs := append(append([]string{}, common...), "--duration", (total - time.Since(start)).Round(time.Second).String(),
		"--stats", filepath.Join(dir, "late.jsonl"))
	peers["late"] = startCLI(t, nil, lateArgs...)
	wg.Wait()

	results := map[string]peer.Result{}
	for _, name := range []string{"a", "b", "c", "late"} {
		if err := peers[name].wait(t, total+time.Minute); err != nil {
			t.Fatalf("%s: %v\n%s", name, err, tail(peers[name].stderr.String()))
		}
		var line map[string]any
		if err := json.Unmarshal(peers[name].stdout.Bytes(), &line); err != nil || line["suite"] != "peer" {
			t.Fatalf("%s: result line %q: %v", name, peers[name].stdout.String(), err)
		}
		for _, k := range []string{"test_accuracy", "steps", "rounds", "bytes_sent"} {
			if _, ok := line[k]; !ok {
				t.Errorf("%s: result line lacks %q", name, k)
			}
		}
		r, err := peer.ReadFinal(filepath.Join(dir, name+".jsonl"))
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		results[name] = r
		t.Logf("%s: accuracy %.4f (first %.4f), %d steps, %d groups, %d failures, longest step %.3fs, %.1f MB sent, joined from %d, swarm epoch %d of %d peers",
			name, r.TestAccuracy, r.FirstAccuracy, r.Steps, r.Groups, r.Failures, r.MaxStepSeconds, float64(r.BytesSent)/1e6, r.Joined, r.Epoch, r.SwarmPeers)
	}
	t.Logf("killed at %v", killedAt)
	for name, r := range results {
		if r.TestAccuracy < 0.85 {
			t.Errorf("%s: test accuracy %.4f < 0.85", name, r.TestAccuracy)
		}
		if r.MaxStepSeconds > timeout.Seconds() {
			t.Errorf("%s: a step waited %.2fs, longer than the %v timeout", name, r.MaxStepSeconds, timeout)
		}
		if r.Groups < 5 {
			t.Errorf("%s: averaged in only %d groups", name, r.Groups)
		}
		// Swarm progress through the DHT: the others are seen, and the
		// samples of all (about 4 x 7000 steps x 64) make several epochs
		// of 100000.
		if r.SwarmPeers < 3 || r.Epoch < 2 {
			t.Errorf("%s: swarm progress shows %d peers, epoch %d", name, r.SwarmPeers, r.Epoch)
		}
	}
	// The late peer started from the swarm's state: its first evaluation,
	// right after the download, is within 2 points of the others' at that time.
	late := results["late"]
	if late.Joined < 1 || len(late.Curve) == 0 {
		t.Fatalf("late peer did not join with downloaded state: %+v", late)
	}
	first := late.Curve[0]
	var others []float64
	for _, name := range []string{"a", "b", "c"} {
		others = append(others, accuracyAt(results[name].Curve, first.Unix))
	}
	var mean float64
	for _, a := range others {
		mean += a / float64(len(others))
	}
	t.Logf("late peer's first evaluation %.4f; the others' at that time %.4f", first.Accuracy, others)
	// Not behind by more than 2 points. The downloaded state is the mean of
	// two donors' replicas, which early in training evaluates a little above
	// a single replica (+0.9 points typically, +2.6 seen once under load):
	// more than 3 points above would mean the comparison is broken.
	if d := first.Accuracy - mean; d < -0.02 || d > 0.03 {
		t.Errorf("late peer's first evaluation %.4f, the others' %.4f at that time: %+.1f points", first.Accuracy, mean, 100*d)
	}
}

// waitFor polls cond until it holds, failing the test after d.
func waitFor(t *testing.T, what string, d time.Duration, cond func() bool) {
	t.Helper()
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	deadline := time.After(d)
	for !cond() {
		select {
		case <-tick.C:
		case <-deadline:
			t.Fatalf("waited %v for %s", d, what)
		}
	}
}

// accuracyAt interpolates a curve's accuracy linearly at wall-clock time
// unix (the nearest end outside the curve).
func accuracyAt(curve []peer.Eval, unix float64) float64 {
	if len(curve) == 0 {
		return math.NaN()
	}
	if unix <= curve[0].Unix {
		return curve[0].Accuracy
	}
	for i := 1; i < len(curve); i++ {
		a, b := curve[i-1], curve[i]
		if unix <= b.Unix {
			f := (unix - a.Unix) / max(b.Unix-a.Unix, 1e-9)
			return a.Accuracy + f*(b.Accuracy-a.Accuracy)
		}
	}
	return curve[len(curve)-1].Accuracy
}

// TestPeerLeavesCleanlyAndResumes checks SIGTERM: the peer exits 0 with a
// result line, writes its checkpoint, and a restart resumes from it.
func TestPeerLeavesCleanlyAndResumes(t *testing.T) {
	if testing.Short() {
		t.Skip("starts processes")
	}
	needFashionMNIST(t)
	dir := t.TempDir()
	_, dhtAddr := startDHTProcess(t)
	ck := filepath.Join(dir, "peer.safetensors")
	stats := filepath.Join(dir, "stats.jsonl")
	args := []string{"peer", "--dht", dhtAddr, "--listen", "/ip4/127.0.0.1/tcp/0", "--min-peers", "1", "--json", "--quiet",
		"--checkpoint", ck, "--limit", "2000", "--eval-examples", "500", "--run-id", "solo",
		"--stats", stats, "--stats-every", "200ms"}
	p := startCLI(t, nil, args...)
	// Stop it once it trains (a stats line is written after a step).
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		if snaps, _ := peer.ReadSnapshots(stats); len(snaps) > 0 && snaps[0].Stats.Steps > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the peer did not start training; stderr:\n%s", tail(p.stderr.String()))
		}
	}
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := p.wait(t, 30*time.Second); err != nil {
		t.Fatalf("SIGTERM: %v\n%s", err, tail(p.stderr.String()))
	}
	var first map[string]any
	if err := json.Unmarshal(p.stdout.Bytes(), &first); err != nil {
		t.Fatalf("result line %q: %v", p.stdout.String(), err)
	}
	if _, err := os.Stat(ck); err != nil {
		t.Fatalf("no checkpoint after SIGTERM: %v", err)
	}
	again := startCLI(t, nil, append(args[:len(args)-4], "--steps", "5")...)
	if err := again.wait(t, 30*time.Second); err != nil {
		t.Fatalf("restart: %v\n%s", err, tail(again.stderr.String()))
	}
	var second map[string]any
	if err := json.Unmarshal(again.stdout.Bytes(), &second); err != nil {
		t.Fatal(err)
	}
	if second["resumed"] != true || second["rounds"].(float64) != first["rounds"].(float64)+5 {
		t.Fatalf("restart did not resume: first %v, second %v", first, second)
	}
}
