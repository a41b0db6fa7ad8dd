//go:build linux

package main

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/skyhive/skyhive/bench"
	"github.com/skyhive/skyhive/swarm"
)

// writeSpec writes a swarm spec into dir and returns its path.
func writeSpec(t *testing.T, dir, spec string) string {
	t.Helper()
	path := filepath.Join(dir, "spec.json")
	if err := os.WriteFile(path, []byte(spec), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// processesUsing returns the PIDs of the processes whose command line
// mentions dir: a swarm's peers get their identity files from it.
func processesUsing(t *testing.T, dir string) []int {
	t.Helper()
	ents, err := os.ReadDir("/proc")
	if err != nil {
		t.Fatal(err)
	}
	var pids []int
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == os.Getpid() {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err == nil && bytes.Contains(b, []byte(dir)) {
			pids = append(pids, pid)
		}
	}
	return pids
}

// requireNothingRunning waits up to 10 s for every process of the swarm in
// dir to be gone.
func requireNothingRunning(t *testing.T, dir string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		pids := processesUsing(t, dir)
		if len(pids) == 0 {
			return
		}
		if time.Now().After(deadline) {
			for _, pid := range pids {
				syscall.Kill(pid, syscall.SIGKILL)
			}
			t.Fatalf("processes %v of the swarm still running", pids)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// TestSwarmRunProcesses runs a small swarm as child processes on loopback
// (no root needed): a DHT and three all-reduce peers. Every peer finishes,
// the benchmark lines say so, and nothing is left running.
func TestSwarmRunProcesses(t *testing.T) {
	dir := t.TempDir()
	spec := writeSpec(t, dir, `{
  "name": "tiny",
  "isolation": "processes",
  "timeout": "2m",
  "devices": [
    {"name": "dht", "count": 1, "role": "dht"},
    {"name": "peer", "count": 3, "role": "peer",
     "config": {"algo": "allreduce", "min_peers": 3, "steps": 30, "batch": 32, "shard": "{i}/{n}", "run_id": "tiny"}}
  ]
}`)
	peers := filepath.Join(dir, "peers")
	p := startCLI(t, nil, "swarm", "run", spec, "--json", "--dir", peers)
	if err := p.wait(t, 2*time.Minute); err != nil {
		t.Fatalf("swarm run: %v\n%s", err, tail(p.stderr.String()))
	}
	got := map[string]bench.Result{}
	for _, l := range strings.Split(strings.TrimSpace(p.stdout.String()), "\n") {
		var r bench.Result
		if err := json.Unmarshal([]byte(l), &r); err != nil || r.Suite != "swarm" || r.Case != "tiny" {
			t.Fatalf("line %q: %+v, %v", l, r, err)
		}
		got[r.Metric] = r
	}
	if r := got["finished"]; r.Value != 3 {
		t.Errorf("%v peers finished, want 3", r.Value)
	}
	// 30 steps of 3×32 examples: far from converged, but learning.
	if r, ok := got["test_accuracy"]; !ok || r.Min < 0.5 {
		t.Errorf("test accuracy %+v", r)
	}
	for _, name := range []string{"dht-0", "peer-0", "peer-1", "peer-2"} {
		if _, err := os.Stat(filepath.Join(peers, name+".log")); err != nil {
			t.Error(err)
		}
	}
	requireNothingRunning(t, peers)
}

// A peer that cannot start fails the run with an error that names it and
// quotes its log; the services started before it are stopped.
func TestSwarmRunPeerFailsToStart(t *testing.T) {
	dir := t.TempDir()
	spec := writeSpec(t, dir, `{
  "name": "bad",
  "isolation": "processes",
  "timeout": "1m",
  "devices": [
    {"name": "dht", "count": 1, "role": "dht"},
    {"name": "server", "count": 1, "role": "server", "config": {"experts": "ffn.[0:x]"}},
    {"name": "peer", "count": 2, "role": "peer", "config": {"algo": "local", "min_peers": 2, "steps": 5, "run_id": "bad"}}
  ]
}`)
	peers := filepath.Join(dir, "peers")
	p := startCLI(t, nil, "swarm", "run", spec, "--dir", peers)
	err := p.wait(t, time.Minute)
	msg := p.stderr.String()
	if err == nil || !strings.Contains(msg, "1 peer(s) failed") || !strings.Contains(msg, "server-0: exit status 1") || !strings.Contains(msg, `malformed expert uid: range "[0:x]"`) {
		t.Fatalf("exit %v, stderr:\n%s", err, msg)
	}
	if !strings.Contains(p.stdout.String(), "dht-0") {
		t.Errorf("no summary on stdout:\n%s", p.stdout.String())
	}
	requireNothingRunning(t, peers)
}

// longSwarmSpec is a swarm of a DHT and two local-SGD peers that train for
// five minutes: longer than any test waits for it.
const longSwarmSpec = `{
  "name": "long",
  "isolation": "processes",
  "devices": [
    {"name": "dht", "count": 1, "role": "dht"},
    {"name": "peer", "count": 2, "role": "peer", "config": {"algo": "local", "duration": "5m", "batch": 32}}
  ]
}`

// Killing `swarm run` itself (SIGKILL: it cannot clean up) still leaves no
// peer running: each child dies with its parent.
func TestSwarmRunKilledLeavesNothing(t *testing.T) {
	dir := t.TempDir()
	spec := writeSpec(t, dir, longSwarmSpec)
	peers := filepath.Join(dir, "peers")
	p := startCLI(t, nil, "swarm", "run", spec, "--dir", peers)
	deadline := time.Now().Add(time.Minute)
	children := func() int { // the swarm's peers, not swarm run itself
		n := 0
		for _, pid := range processesUsing(t, peers) {
			if pid != p.cmd.Process.Pid {
				n++
			}
		}
		return n
	}
	for children() < 3 {
		if time.Now().After(deadline) {
			p.cmd.Process.Kill()
			<-p.done
			t.Fatalf("the swarm's 3 peers did not start:\n%s", tail(p.stderr.String()))
		}
		time.Sleep(100 * time.Millisecond)
	}
	p.cmd.Process.Kill()
	<-p.done
	requireNothingRunning(t, peers)
}

// TestSwarmRunStopsOnSignal sends SIGTERM to `swarm run` while its peers
// train: it stops them and exits within stopBound, leaving nothing running.
func TestSwarmRunStopsOnSignal(t *testing.T) {
	dir := t.TempDir()
	spec := writeSpec(t, dir, longSwarmSpec)
	peers := filepath.Join(dir, "peers")
	signalled(t, "2 of 2 training peers running", 5*time.Second, "swarm", "run", spec, "--dir", peers)
	requireNothingRunning(t, peers)
}

// A closed swarm (the runner makes a secret and gives it to every member)
// refuses a stranger: the stranger fails to join with an error saying the
// swarm is closed, the members train, and the run succeeds.
func TestSwarmRunClosedRefusesStranger(t *testing.T) {
	dir := t.TempDir()
	spec := writeSpec(t, dir, `{
  "name": "closed",
  "isolation": "processes",
  "timeout": "2m",
  "closed": true,
  "devices": [
    {"name": "dht", "count": 1, "role": "dht"},
    {"name": "peer", "count": 2, "role": "peer",
     "config": {"algo": "allreduce", "min_peers": 2, "steps": 20, "batch": 32, "run_id": "closed"}},
    {"name": "intruder", "count": 1, "role": "peer", "stranger": true,
     "config": {"algo": "allreduce", "min_peers": 2, "steps": 20, "run_id": "closed", "join_timeout": "10s"}}
  ]
}`)
	peers := filepath.Join(dir, "peers")
	stats := filepath.Join(dir, "run.json")
	p := startCLI(t, nil, "swarm", "run", spec, "--stats", stats, "--dir", peers)
	if err := p.wait(t, 2*time.Minute); err != nil {
		t.Fatalf("swarm run: %v\n%s", err, tail(p.stderr.String()))
	}
	b, err := os.ReadFile(stats)
	if err != nil {
		t.Fatal(err)
	}
	var res swarm.RunResult
	if err := json.Unmarshal(b, &res); err != nil {
		t.Fatal(err)
	}
	for _, pr := range res.Peers {
		switch {
		case pr.Stranger:
			if pr.State != swarm.StateFailed || !strings.Contains(pr.Error, "not admitted") {
				t.Errorf("stranger %s: state %s, error %q", pr.Name, pr.State, pr.Error)
			}
		case strings.HasPrefix(pr.Name, "peer-") && (pr.State != swarm.StateExited || pr.TestAccuracy == nil):
			t.Errorf("member %s: state %s: %s", pr.Name, pr.State, pr.Error)
		}
	}
	if st, err := os.Stat(filepath.Join(peers, "swarm.secret")); err != nil || st.Mode().Perm() != 0o600 {
		t.Errorf("swarm secret: %v, %v", st, err)
	}
	requireNothingRunning(t, peers)
}
