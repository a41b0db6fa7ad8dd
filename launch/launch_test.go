package launch

import (
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"
)

func TestWriteReadRoundTrip(t *testing.T) {
	path := filepath.Join(t.TempDir(), "peer.json")
	want := Peer{
		Net:     Net{Listen: []string{"/ip4/127.0.0.1/tcp/0"}, DHT: []string{"/ip4/127.0.0.1/tcp/4001/p2p/X"}},
		Process: Process{Region: "eu", GEMM: "go", StatusEvery: -1},
		Algo:    "diloco", Model: "mlp-small", MinPeers: 4, LR: 0.1, OuterMomentum: -1,
		Duration: Duration(90 * time.Second), Shard: "1/4", Quiet: true,
	}
	if err := Write(path, want); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(b), `"duration": "1m30s"`) || !strings.Contains(string(b), `"role": "peer"`) {
		t.Errorf("file does not hold the role and a readable duration:\n%s", b)
	}
	f, err := Read(path)
	if err != nil {
		t.Fatal(err)
	}
	got := Peer{Seed: 7, Batch: 32} // defaults: the file leaves Seed out and replaces nothing else
	if err := f.Decode(&got); err != nil {
		t.Fatal(err)
	}
	want.Seed, want.Batch = 7, 32
	if !reflect.DeepEqual(got, want) {
		t.Errorf("read back\n%+v\nwant\n%+v", got, want)
	}
}

func TestDecodeRefusesUnknownFieldAndOtherRole(t *testing.T) {
	f, err := Parse([]byte(`{"role": "peer", "config": {"algo": "wagma", "algorithm": "wagma"}}`))
	if err != nil {
		t.Fatal(err)
	}
	var p Peer
	if err := f.Decode(&p); err == nil || !strings.Contains(err.Error(), "algorithm") {
		t.Errorf("unknown field: got %v, want an error naming it", err)
	}
	f.Role = "worker"
	if err := f.Decode(&p); !errors.Is(err, ErrRole) {
		t.Errorf("other role: got %v, want ErrRole", err)
	}
	for _, bad := range []string{`{"role": "peer"}`, `{"config": {}}`, `{"role": "peer", "config": {}, "x": 1}`, `{"role": "peer", "config": {}} {}`, `[]`} {
		if _, err := Parse([]byte(bad)); !errors.Is(err, ErrFormat) {
			t.Errorf("Parse(%s): got %v, want ErrFormat", bad, err)
		}
	}
	if _, err := Parse([]byte(`{"role": "peer", "config": {"duration": "soon"}}`)); err != nil {
		t.Fatal(err) // the config is decoded by Decode, not Parse
	}
	f, _ = Parse([]byte(`{"role": "peer", "config": {"duration": "soon"}}`))
	if err := f.Decode(&p); err == nil {
		t.Error("a malformed duration was accepted")
	}
}

func TestReadRefusesOversizeFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "big.json")
	big := `{"role": "peer", "config": {"model": "` + strings.Repeat("x", MaxFileSize) + `"}}`
	if err := os.WriteFile(path, []byte(big), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := Read(path); !errors.Is(err, ErrTooLarge) {
		t.Errorf("got %v, want ErrTooLarge", err)
	}
	if err := Write(path, Peer{Model: strings.Repeat("x", MaxFileSize)}); !errors.Is(err, ErrTooLarge) {
		t.Errorf("Write: got %v, want ErrTooLarge", err)
	}
}

func TestCommandPassesOnlyTheFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "p.json")
	cmd, err := Command("/bin/skyhive", path, Peer{Algo: "wagma"})
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"/bin/skyhive", "@" + path}; !reflect.DeepEqual(cmd.Args, want) {
		t.Errorf("args %q, want %q", cmd.Args, want)
	}
	if got, ok := FileArg(cmd.Args[1:]); !ok || got != path {
		t.Errorf("FileArg: %q %v", got, ok)
	}
	for _, args := range [][]string{nil, {"@"}, {"peer"}, {"@a", "@b"}} {
		if _, ok := FileArg(args); ok {
			t.Errorf("FileArg(%q) took it for a config file", args)
		}
	}
	if _, err := os.Stat(path); err != nil {
		t.Errorf("Command wrote no file: %v", err)
	}
}

func TestTail(t *testing.T) {
	path := filepath.Join(t.TempDir(), "x.log")
	if err := os.WriteFile(path, []byte("one\n\ntwo\nthree\nskyhive: --model: unknown model\n\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if got, want := Tail(path, 2), "three; skyhive: --model: unknown model"; got != want {
		t.Errorf("Tail = %q, want %q", got, want)
	}
	if got := Tail(filepath.Join(t.TempDir(), "none"), 2); got != "" {
		t.Errorf("Tail of a missing file = %q", got)
	}
}
