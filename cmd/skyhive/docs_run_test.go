package main

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"
)

// docRun says how TestDocumentedCommandsRun runs one documented command.
type docRun struct {
	// skip says why the command is not run here ("" runs it).
	skip string
	// shrink are flags appended to make the run small (a flag given twice
	// takes its last value).
	shrink []string
	// fails marks a command the docs show failing ("# exits 1"): it must
	// exit non-zero.
	fails bool
	// copies is how many instances run at once (averaging peers need
	// company); 0 means 1.
	copies int
	// service marks a long-running command: it is started, must become
	// ready, keeps running while the file's other commands run, and must
	// stop within serviceStop of SIGTERM, with status 0.
	service bool
}

// serviceStop is how soon a long-running command must exit after SIGTERM.
const serviceStop = 2 * time.Second

// lmShrink and imageShrink make a training run a few steps on a little data.
var (
	lmShrink    = []string{"--corpus-bytes=200000", "--eval-tokens=2000"}
	imageShrink = []string{"--limit=1000", "--eval-examples=500"}
)

// docRunFor decides how a documented command runs: the command path picks
// the size flags; what cannot run on one machine is skipped with a reason.
func docRunFor(c docCommand) docRun {
	path := commandPath(c.args)
	text := " " + strings.Join(c.args, " ") + " "
	switch {
	case strings.Contains(text, "10.0.0.1") || (path == "train pipeline" && strings.Contains(text, "--join-wait")):
		return docRun{skip: "needs other machines"}
	case path == "swarm run":
		return docRun{skip: "root and minutes: TestSwarmRun* run swarm specs"}
	case path == "bench" && slices.Contains(c.args, "all"):
		return docRun{skip: "every suite, minutes: each suite's own line runs"}
	case path == "bench soak":
		return docRun{skip: "ten minutes by design: the soak's own tests run it short"}
	case path == "experiment":
		return docRun{skip: "a long reproduction: package experiment's tests run each quick"}
	case path == "server" && strings.Contains(text, " --executor python "):
		return docRun{skip: "needs PyTorch and the Python package: TestPyTorchExperts runs servers with PyTorch experts"}
	case strings.Contains(text, " --executor python "):
		return docRun{skip: "needs PyTorch and the Python package: TestTrainPipelineLMInPyTorch runs workers computing in PyTorch"}
	case path == "dht" || path == "server" || path == "dashboard":
		return docRun{service: true}
	case path == "train":
		if isLM(c.args) {
			return docRun{shrink: concat([]string{"--steps=3"}, lmShrink)}
		}
		return docRun{shrink: concat([]string{"--epochs=1"}, imageShrink)}
	case path == "train pipeline" || path == "demo moe" || path == "train moe":
		return docRun{shrink: sized(c.args, "--steps=3")}
	case path == "train averaging" || path == "demo averaging":
		return docRun{shrink: sized(c.args, "--steps=3", "--duration=40s")}
	case path == "peer":
		return docRun{shrink: sized(c.args, "--steps=3", "--duration=40s", "--min-peers=2"), copies: 2}
	case path == "tokenize":
		return docRun{shrink: lmShrink}
	case path == "bench pytorch":
		return docRun{skip: "needs the Python package on PYTHONPATH: python/tests/test_bench.py runs it (make pytest)"}
	case strings.HasPrefix(path, "bench"):
		return docRun{shrink: []string{"--quick"}}
	case path == "attack":
		return docRun{shrink: []string{"--duration=2s"}}
	case path == "plan":
		return docRun{shrink: []string{"--time-limit=3s"}}
	case path == "profile model":
		return docRun{shrink: []string{"--reps=1"}}
	}
	return docRun{}
}

// withExpectation sets what the docs say of a command's outcome.
func withExpectation(r docRun, c docCommand) docRun {
	r.fails = strings.Contains(c.text, "# exits 1")
	return r
}

// sized is the shrink of a training command: its own flags, then the data
// size flags of its kind of model.
func sized(args []string, own ...string) []string {
	if isLM(args) {
		return concat(own, lmShrink)
	}
	return concat(own, imageShrink)
}

// isLM reports whether a command line trains a language model.
func isLM(args []string) bool {
	for i := 0; i+1 < len(args); i++ {
		v := args[i+1]
		switch args[i] {
		case "--data":
			if v == "gcide" || strings.HasPrefix(v, "gcide:") || strings.HasPrefix(v, "text:") || strings.HasPrefix(v, "tokens:") {
				return true
			}
		case "--model":
			if strings.HasPrefix(v, "gpt") || strings.HasPrefix(v, "bert-mlm") {
				return true
			}
		}
	}
	return false
}

// known keeps the flags of shrink ("--name=value") that the command
// defines.
func known(args, shrink []string) []string {
	c, _, err := newRootCmd().Find(legacyTrainArgs(args, new(strings.Builder)))
	if err != nil {
		return nil
	}
	var out []string
	for _, f := range shrink {
		name, _, _ := strings.Cut(strings.TrimPrefix(f, "--"), "=")
		if c.Flags().Lookup(name) != nil {
			out = append(out, f)
		}
	}
	return out
}

// commandPath is the subcommand part of a command line ("train pipeline").
func commandPath(args []string) string {
	root := newRootCmd()
	c, _, err := root.Find(legacyTrainArgs(args, new(strings.Builder)))
	if err != nil {
		return ""
	}
	return strings.TrimPrefix(c.CommandPath(), "skyhive ")
}

func concat(xs ...[]string) []string {
	var out []string
	for _, x := range xs {
		out = append(out, x...)
	}
	return out
}

// docSubst turns a documented command line into one that runs on this
// machine: the swarm's address is the test's DHT node, listen addresses
// and ports are loopback and free.
func docSubst(args []string, dht string) []string {
	addr := regexp.MustCompile(`^(\$?ADDR|/ip4/127\.0\.0\.1/tcp/4001/p2p/.*|MA/p2p/ID)$`)
	out := make([]string, 0, len(args))
	for _, a := range args {
		switch {
		case addr.MatchString(a):
			a = dht
		case strings.HasPrefix(a, "/ip4/0.0.0.0/tcp/"):
			a = "/ip4/127.0.0.1/tcp/0"
		case regexp.MustCompile(`^(0\.0\.0\.0|127\.0\.0\.1):\d+$`).MatchString(a):
			a = "127.0.0.1:0"
		}
		out = append(out, a)
	}
	return out
}

// docWorkDir is a directory laid out as the docs expect the current
// directory to be: the repository's examples, and a text and a token
// file for the commands that train on the user's own data.
func docWorkDir(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	examples, err := filepath.Abs("../../examples")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(examples, filepath.Join(dir, "examples")); err != nil {
		t.Fatal(err)
	}
	text := strings.Repeat("The quick brown fox jumps over the lazy dog. A dictionary defines words with other words. ", 3000)
	if err := os.WriteFile(filepath.Join(dir, "book.txt"), []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	tokens := make([]byte, 2*200000)
	for i := 0; i < len(tokens); i += 2 {
		v := (i * 7919) % 50000
		tokens[i], tokens[i+1] = byte(v), byte(v>>8)
	}
	if err := os.WriteFile(filepath.Join(dir, "train.bin"), tokens, 0o644); err != nil {
		t.Fatal(err)
	}
	return dir
}

// docProc is a documented command started by the test.
type docProc struct {
	cmd  *exec.Cmd
	out  *syncBuffer
	done chan struct{}
	err  error
}

func startDocProc(t *testing.T, dir string, args []string) *docProc {
	t.Helper()
	p := &docProc{out: &syncBuffer{}, done: make(chan struct{})}
	p.cmd = exec.Command(os.Args[0], args...)
	p.cmd.Dir = dir
	p.cmd.Env = append(os.Environ(), envAsCLI+"=1")
	p.cmd.Stdout, p.cmd.Stderr = p.out, p.out
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

// ready waits until a service prints an address it serves on, or exits.
func (p *docProc) ready(d time.Duration) error {
	re := regexp.MustCompile(`/ip4/127\.0\.0\.1/tcp/\d+/p2p/\w+|http://127\.0\.0\.1:\d+`)
	deadline := time.After(d)
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		if re.MatchString(p.out.String()) {
			return nil
		}
		select {
		case <-p.done:
			return errors.New("exited before it was ready")
		case <-deadline:
			return errors.New("printed no address it serves on within " + d.String())
		case <-tick.C:
		}
	}
}

// TestDocumentedCommandsRun runs every runnable `skyhive` command line of
// README.md and docs/*.md, shrunk by documented flags, on loopback: each
// one-shot command must exit 0; each long-running one must become ready
// and stop within 2 s of SIGTERM with status 0. Commands of one file run in
// its order in one directory (a later one may read what an earlier one
// wrote), with that file's long-running commands started first.
func TestDocumentedCommandsRun(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the documented commands: minutes")
	}
	needFashionMNIST(t)
	_, dht := startDHTProcess(t)
	byFile := map[string][]docCommand{}
	var files []string
	seen := map[string]bool{}
	for _, c := range allDocCommands(t) {
		key := strings.Join(c.args, "\x00")
		if c.synopsis || seen[key] {
			continue // a usage pattern, or run already for another file
		}
		seen[key] = true
		if _, ok := byFile[c.file]; !ok {
			files = append(files, c.file)
		}
		byFile[c.file] = append(byFile[c.file], c)
	}
	for _, f := range files {
		t.Run(f, func(t *testing.T) { runDocFile(t, byFile[f], dht) })
	}
}

func runDocFile(t *testing.T, cmds []docCommand, dht string) {
	dir := docWorkDir(t)
	type service struct {
		c docCommand
		p *docProc
	}
	var services []service
	for _, c := range cmds {
		r := docRunFor(c)
		if r.skip != "" || !r.service {
			continue
		}
		p := startDocProc(t, dir, append(docSubst(c.args, dht), known(c.args, r.shrink)...))
		if err := p.ready(60 * time.Second); err != nil {
			t.Errorf("%s:%d: %s\n\t%v\n%s", c.file, c.line, c.text, err, tail(p.out.String()))
			continue
		}
		services = append(services, service{c, p})
	}
	for _, c := range cmds {
		r := docRunFor(c)
		if r.skip != "" {
			t.Logf("%s:%d: skipped (%s): %s", c.file, c.line, r.skip, c.text)
			continue
		}
		if r.service {
			continue
		}
		r = withExpectation(r, c)
		runDocOneShot(t, c, r, dir, dht)
	}
	for _, s := range services {
		start := time.Now()
		s.p.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-s.p.done:
			if s.p.err != nil {
				t.Errorf("%s:%d: %s\n\tafter SIGTERM: %v\n%s", s.c.file, s.c.line, s.c.text, s.p.err, tail(s.p.out.String()))
			}
			if d := time.Since(start); d > serviceStop {
				t.Errorf("%s:%d: %s\n\tstopped %v after SIGTERM (at most %v)", s.c.file, s.c.line, s.c.text, d.Round(time.Millisecond), serviceStop)
			}
		case <-time.After(10 * time.Second):
			t.Errorf("%s:%d: %s\n\tstill running 10 s after SIGTERM\n%s", s.c.file, s.c.line, s.c.text, tail(s.p.out.String()))
		}
	}
}

// runDocOneShot runs a command that ends by itself (r.copies instances at
// once) and checks its exit status against the docs.
func runDocOneShot(t *testing.T, c docCommand, r docRun, dir, dht string) {
	t.Helper()
	args := append(docSubst(c.args, dht), known(c.args, r.shrink)...)
	ps := []*docProc{startDocProc(t, dir, args)}
	for i := 1; i < r.copies; i++ {
		ps = append(ps, startDocProc(t, dir, args))
	}
	start := time.Now()
	defer func() { t.Logf("%s:%d: %.1f s", c.file, c.line, time.Since(start).Seconds()) }()
	timeout := time.After(3 * time.Minute)
	for _, p := range ps {
		select {
		case <-p.done:
			switch {
			case p.err != nil && !r.fails:
				t.Errorf("%s:%d: %s\n\t%v\n%s", c.file, c.line, c.text, p.err, tail(p.out.String()))
			case p.err == nil && r.fails:
				t.Errorf("%s:%d: %s\n\texited 0; the docs say it fails\n%s", c.file, c.line, c.text, tail(p.out.String()))
			}
		case <-timeout:
			t.Errorf("%s:%d: %s\n\tstill running after 3 minutes\n%s", c.file, c.line, c.text, tail(p.out.String()))
			return
		}
	}
}
