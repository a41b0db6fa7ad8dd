package main

import (
	"context"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/spf13/pflag"

	"github.com/skyhive/skyhive/launch"
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
	fromFile, err := peerDefaults()
	if err != nil {
		t.Fatal(err)
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
	a, err := peerConfig(fromFile)
	if err != nil {
		t.Fatal(err)
	}
	b, err := peerConfig(fromFlags)
	if err != nil {
		t.Fatal(err)
	}
	if a.Data == "" {
		a.Data = "gcide" // the flags resolve it; the peer does the same for the file
	}
	a.Host.IdentityFile, b.Host.IdentityFile = "", ""
	if !reflect.DeepEqual(a, b) || a.ClipNorm != 0 || a.Seq != lmSeq || a.Warmup != lmWarmup {
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
