package main

import (
	"context"
	"encoding/json"
	"maps"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/skyhive/skyhive/averaging/peer"
	"github.com/skyhive/skyhive/launch"
	"github.com/skyhive/skyhive/moe/trainer"
	"github.com/skyhive/skyhive/train"
)

// A config file for a role runs that role with the file's fields over the
// command's defaults; a file with an unknown role or field, or a config
// the role refuses, fails with an error that says so.
func TestRoleFileErrors(t *testing.T) {
	dir := t.TempDir()
	write := func(name, body string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	const dht = "/ip4/127.0.0.1/tcp/4001/p2p/12D3KooWHtz3SAKgN44ngiGCvvvWoaPiiymfDZXhSqyjw3q17bWd"
	cases := []struct{ body, want string }{
		{`{"role": "painter", "config": {}}`, `unknown role "painter"`},
		{`{"role": "peer", "config": {"algorithm": "wagma"}}`, `unknown field "algorithm"`},
		{`{"role": "peer", "config": {"algo": "sgd", "dht": ["` + dht + `"]}}`, "--algo"},
		{`{"role": "peer", "config": {"algo": "wagma"}}`, "--dht is required"},
		{`{"role": "peer", "config": {"dht": ["` + dht + `"], "shard": "3/2"}}`, "--shard"},
		{`{"role": "peer", "config": {"dht": ["` + dht + `"], "model": "gpt-mini", "data": "fashion-mnist"}}`, "gpt-mini is a language model"},
		{`{"role": "server", "config": {"workers": 2}}`, `unknown field "workers"`},
		{`{"role": "server", "config": {"experts": "ffn.[0:x]", "listen": ["/ip4/127.0.0.1/tcp/0"]}}`, "ffn.[0:x]"},
		{`{"role": "server", "config": {"status_every": "10ms"}}`, "--status-every"},
		{`{"role": "train-moe", "config": {"grids": "ffn.4.4"}}`, "--dht is required"},
		{`{"role": "dht", "config": {"status_every": "10ms"}}`, "--status-every"},
		{`{"role": "dht", "config": {"stats": "s.jsonl", "stats_every": "-1s"}}`, "--stats-every must be positive"},
		{`{"role": "dht", "config": {"k_best": 4}}`, `unknown field "k_best"`},
		{`{"role": "train-moe", "config": {"dht": ["` + dht + `"], "max_failed_steps": 2}}`, "--max-failed-steps 2"},
	}
	for i, c := range cases {
		var out syncBuffer
		err := runRoleFile(context.Background(), write("c"+string(rune('a'+i))+".json", c.body), &out, &out)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: got %v, want an error containing %q", c.body, err, c.want)
		}
	}
}

// The peer's flags and a config file of the same options give the same
// peer configuration: the defaults of one are the defaults of the other.
func TestPeerFlagsAndFileAgree(t *testing.T) {
	const dht = "/ip4/127.0.0.1/tcp/4001/p2p/12D3KooWHtz3SAKgN44ngiGCvvvWoaPiiymfDZXhSqyjw3q17bWd"
	var none peerFlags
	nfl := pflag.NewFlagSet("peer", pflag.ContinueOnError)
	none.register(nfl)
	fromFile := peer.Defaults()
	if noFlags, err := none.config(nfl); err != nil || !reflect.DeepEqual(noFlags, fromFile) {
		t.Fatalf("without flags: %+v, %v; peer.Defaults: %+v", noFlags, err, fromFile)
	}
	path := filepath.Join(t.TempDir(), "peer.json")
	if err := launch.Write(path, launch.Peer{Net: launch.Net{DHT: []string{dht}}, Algo: "diloco", Model: "gpt-mini", Clip: -1}); err != nil {
		t.Fatal(err)
	}
	f, err := launch.Read(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Decode(&fromFile); err != nil {
		t.Fatal(err)
	}
	var pf peerFlags
	fl := pflag.NewFlagSet("peer", pflag.ContinueOnError)
	pf.register(fl)
	if err := fl.Parse([]string{"--dht", dht, "--algo", "diloco", "--model", "gpt-mini", "--clip", "0"}); err != nil {
		t.Fatal(err)
	}
	fromFlags, err := pf.config(fl)
	if err != nil {
		t.Fatal(err)
	}
	peerConfig := func(l launch.Peer) peer.Config {
		host, err := roleHost(l.Net, l.Process)
		if err != nil {
			t.Fatal(err)
		}
		c, err := peer.FromLaunch(l, host)
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	a, b := peerConfig(fromFile), peerConfig(fromFlags)
	if a.Data == "" {
		a.Data = "gcide" // the flags resolve it; the peer does the same for the file
	}
	a.Host.IdentityFile, b.Host.IdentityFile = "", ""
	if !reflect.DeepEqual(a, b) || a.ClipNorm != 0 || a.Seq != train.DefaultSeq || a.Warmup != int(lmDefaults.Warmup) {
		t.Errorf("from the file:\n%+v\nfrom the flags:\n%+v", a, b)
	}
}

// A launcher whose children fail shows their own errors: a misspelt model
// given to train averaging fails with the peer's message, not only with
// the count of peers that finished.
func TestTrainAveragingShowsPeerErrors(t *testing.T) {
	t.Setenv(envAsCLI, "1")
	var out syncBuffer
	err := runCLI(context.Background(), &out, "train", "averaging", "--model", "mlp-smal", "--peers", "2",
		"--duration", "20s", "--logs", t.TempDir())
	if err == nil || !strings.Contains(err.Error(), "mlp-smal") || !strings.Contains(err.Error(), "log ends") {
		t.Fatalf("got %v, want the peers' error naming the model; output:\n%s", err, out.String())
	}
}

// Every field of the configs that run through a command's flags names one
// of its flags, of a type that takes the field's values: a renamed flag
// fails here, not in a launched child.
func TestRoleConfigsNameFlags(t *testing.T) {
	cases := []struct {
		role   string
		newCmd func() *cobra.Command
		absent []string // fields of shared structs the command has no flag for
	}{
		{launch.RoleWorker, newWorkerCmd, []string{"dht", "status_every"}},
		{launch.RoleDHT, newDHTCmd, nil},
		{launch.RoleServer, newServerCmd, nil},
		{launch.RoleMoETrainer, newTrainMoECmd, nil},
		{launch.RolePipeline, newTrainPipelineCmd, []string{"region"}},
	}
	kinds := map[string][]string{
		"string": {"string"}, "[]string": {"stringSlice"}, "bool": {"bool"}, "*bool": {"bool"}, "int": {"int"}, "int64": {"int64", "int"},
		"uint64": {"uint64"}, "float64": {"float64"}, "launch.Duration": {"duration"},
	}
	for _, c := range cases {
		cfg, ok := launch.New(c.role)
		if !ok {
			t.Fatalf("no role %s", c.role)
		}
		fl := c.newCmd().Flags()
		for name, v := range configFields(reflect.ValueOf(cfg).Elem()) {
			if name == "gemm" || slices.Contains(c.absent, name) {
				continue
			}
			f := fl.Lookup(strings.ReplaceAll(name, "_", "-"))
			if f == nil {
				t.Errorf("%s: field %q names no flag", c.role, name)
				continue
			}
			if want := kinds[v.Type().String()]; !slices.Contains(want, f.Value.Type()) {
				t.Errorf("%s: field %q is %s, flag --%s is %s", c.role, name, v.Type(), f.Name, f.Value.Type())
			}
		}
	}
}

// A config file sets the flags its fields name and runs the command: a
// worker with a config naming no coordinator fails as `skyhive worker`
// without --join does, and one with a field its command lacks is refused.
func TestFlagRoleFromFile(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "w.json")
	if err := launch.Write(path, launch.Worker{Net: launch.Net{DHT: []string{"/ip4/127.0.0.1/tcp/1/p2p/x"}}, Name: "w0"}); err != nil {
		t.Fatal(err)
	}
	var out syncBuffer
	if err := runRoleFile(context.Background(), path, &out, &out); err == nil || !strings.Contains(err.Error(), `"dht" is not an option`) {
		t.Errorf("worker with a dht: got %v", err)
	}
	if err := launch.Write(path, launch.Worker{Name: "w0", Join: "not-an-address", Slowdown: 2}); err != nil {
		t.Fatal(err)
	}
	if err := runRoleFile(context.Background(), path, &out, &out); err == nil || !strings.Contains(err.Error(), "--join") {
		t.Errorf("worker with a bad --join: got %v", err)
	}
}

// An expert server runs from its config file as `skyhive server` does with
// the same options: it serves, prints its address and, when stopped, its
// statistics and the checkpoint it writes.
func TestServerRoleFromFile(t *testing.T) {
	dir := t.TempDir()
	path, ckpt := filepath.Join(dir, "server.json"), filepath.Join(dir, "experts.safetensors")
	lazy := true
	if err := launch.Write(path, launch.Server{Net: launch.Net{Listen: []string{"/ip4/127.0.0.1/tcp/0"}},
		Experts: "ffn.[0:2]", Hidden: 8, Lazy: &lazy, Checkpoint: ckpt}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var stdout, stderr syncBuffer
	done := make(chan error, 1)
	go func() { done <- runRoleFile(ctx, path, &stdout, &stderr) }()
	for deadline := time.Now().Add(10 * time.Second); !strings.Contains(stderr.String(), "Ctrl-C to stop"); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the server is not serving:\n%s\n%s", stdout.String(), stderr.String())
		}
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(stdout.String(), "/p2p/") || !strings.Contains(stdout.String(), "0 of 2 experts called") ||
		!strings.Contains(stderr.String(), "2 ffn experts (hidden 8, created on first use") {
		t.Fatalf("stdout:\n%s\nstderr:\n%s", stdout.String(), stderr.String())
	}
	if _, err := os.Stat(ckpt); err != nil {
		t.Fatalf("no checkpoint: %v", err)
	}
}

// A MoE trainer runs from its config file as `skyhive train moe` does: it
// takes the experts' hidden size from the DHT when the file gives none,
// trains against the server and prints its result.
func TestMoETrainerRoleFromFile(t *testing.T) {
	if !fashionMNISTInstalled() {
		t.Skip("Fashion-MNIST not installed")
	}
	addr, _ := startServer(t, "--experts", "ffn.[0:2].[0:2]", "--hidden", "16")
	path := filepath.Join(t.TempDir(), "trainer.json")
	if err := launch.Write(path, launch.MoETrainer{Net: launch.Net{Listen: []string{"/ip4/127.0.0.1/tcp/0"}, DHT: []string{addr}},
		Output:   launch.Output{JSON: true},
		Training: launch.Training{Epochs: 1, Limit: 256, Batch: 64},
		Grids:    "ffn.2.2", KBest: 2, EvalLimit: 100}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var stdout, stderr syncBuffer
	if err := runRoleFile(ctx, path, &stdout, &stderr); err != nil {
		t.Fatalf("%v\n%s", err, stderr.String())
	}
	var res trainer.Result
	if err := json.Unmarshal([]byte(stdout.String()), &res); err != nil || res.Steps != 4 || res.Failed != 0 || res.TestAccuracy == 0 {
		t.Fatalf("result %+v (%v):\n%s", res, err, stdout.String())
	}
	if !strings.Contains(stderr.String(), "hidden size 16") {
		t.Fatalf("the model did not take the experts' hidden size:\n%s", stderr.String())
	}
}

// configFields maps the JSON names of a config struct's fields, those of
// embedded structs included, to the fields.
func configFields(v reflect.Value) map[string]reflect.Value {
	out := map[string]reflect.Value{}
	t := v.Type()
	for i := range t.NumField() {
		sf := t.Field(i)
		if sf.Anonymous && sf.Type.Kind() == reflect.Struct {
			maps.Copy(out, configFields(v.Field(i)))
			continue
		}
		name, _, _ := strings.Cut(sf.Tag.Get("json"), ",")
		if name != "" && name != "-" {
			out[name] = v.Field(i)
		}
	}
	return out
}
