package bridge

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"
	"golang.org/x/sys/unix"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, goleak.IgnoreAnyFunction("github.com/ipfs/go-log/v2/writer.(*MirrorWriter).logRoutine"))
}

// serve runs a daemon on a socket in a fresh directory until the test ends.
func serve(t *testing.T, cfg Config) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "bridge") // short: socket paths are bounded
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	cfg.Socket = filepath.Join(dir, "d.sock")
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- Serve(ctx, cfg) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Serve: %v", err)
		}
	})
	for i := 0; i < 500; i++ {
		if _, err := os.Stat(cfg.Socket); err == nil {
			return cfg.Socket
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatal("the daemon did not open its socket")
	return ""
}

func dial(t *testing.T, path string) *net.UnixConn {
	t.Helper()
	c, err := net.DialUnix("unix", nil, &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	_ = c.SetDeadline(time.Now().Add(time.Minute))
	return c
}

func send(t *testing.T, c *net.UnixConn, m Message) {
	t.Helper()
	if err := writeMessage(c, m, nil); err != nil {
		t.Fatal(err)
	}
}

// recvFD reads a message and the descriptor that came with it.
func recvFD(t *testing.T, c *net.UnixConn) (Message, int) {
	t.Helper()
	hdr, oob := make([]byte, 4), make([]byte, unix.CmsgSpace(4))
	n, oobn, _, _, err := c.ReadMsgUnix(hdr, oob)
	if err != nil || n != 4 {
		t.Fatalf("read: %d bytes, %v", n, err)
	}
	fd := -1
	if msgs, err := unix.ParseSocketControlMessage(oob[:oobn]); err == nil && len(msgs) == 1 {
		if fds, err := unix.ParseUnixRights(&msgs[0]); err == nil && len(fds) == 1 {
			fd = fds[0]
		}
	}
	m, err := ReadMessage(io.MultiReader(bytes.NewReader(hdr), c))
	if err != nil {
		t.Fatal(err)
	}
	return m, fd
}

var spec = []ParamSpec{{Name: "w", Shape: []int{3, 4}}, {Name: "b", Shape: []int{4}}}

func TestSessionRefusesBadHello(t *testing.T) {
	sock := serve(t, Config{})
	for name, m := range map[string]Message{
		"not hello":         {Op: OpStep},
		"old version":       {Op: OpHello, Version: Version + 1, Params: spec},
		"bad shape":         {Op: OpHello, Version: Version, Params: []ParamSpec{{Name: "w", Shape: []int{0}}}},
		"training option":   {Op: OpHello, Version: Version, Params: spec, Options: []byte(`{"dht":["x"],"lr":0.1}`)},
		"no dht":            {Op: OpHello, Version: Version, Params: spec},
		"unknown algo":      {Op: OpHello, Version: Version, Params: spec, Options: []byte(`{"dht":["/ip4/127.0.0.1/tcp/9/p2p/12D3KooWAbc"],"algo":"sgd"}`)},
		"too large a model": {Op: OpHello, Version: Version, Params: []ParamSpec{{Name: "w", Shape: []int{1 << 14, 1 << 14}}}},
	} {
		c := dial(t, sock)
		send(t, c, m)
		got, err := ReadMessage(c)
		if err != nil || got.Op != OpError || got.Error == "" {
			t.Errorf("%s: got %+v, %v; want an error reply", name, got, err)
			continue
		}
		if want := map[bool]string{true: KindProtocol, false: KindConfig}[m.Op != OpHello]; got.Kind != want {
			t.Errorf("%s: kind %q, want %q (%s)", name, got.Kind, want, got.Error)
		}
	}
}

func TestSessionSharedMemoryIsSealed(t *testing.T) {
	sock := serve(t, Config{})
	c := dial(t, sock)
	send(t, c, Message{Op: OpHello, Version: Version, Params: spec,
		Options: []byte(`{"dht":["/ip4/127.0.0.1/tcp/9/p2p/12D3KooWDpJ7As7BWAwRMfu1VU2WCqNjvq387JEYKDBj4kx6nXTN"],"join_timeout":"1s","listen":["/ip4/127.0.0.1/tcp/0"]}`)})
	m, fd := recvFD(t, c)
	if m.Op != OpShm || fd < 0 {
		t.Fatalf("got %+v and descriptor %d, want shm with one", m, fd)
	}
	defer unix.Close(fd)
	if m.Elements != 2*16 || m.Bytes != 8*16 {
		t.Fatalf("region of %d elements, %d bytes; want 32, 128", m.Elements, m.Bytes)
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil || st.Size != int64(m.Bytes) {
		t.Fatalf("region size %d, %v", st.Size, err)
	}
	if err := unix.Ftruncate(fd, 4); !errors.Is(err, unix.EPERM) {
		t.Fatalf("shrinking the region: %v, want EPERM (sealed)", err)
	}
	// Joining fails (nobody listens at the DHT's address): a swarm error
	// that names the DHT.
	send(t, c, Message{Op: OpJoin})
	got, err := ReadMessage(c)
	if err != nil || got.Op != OpError || got.Kind != KindSwarm || !strings.Contains(strings.ToLower(got.Error), "dht") {
		t.Fatalf("join: %+v, %v; want a swarm error naming the DHT", got, err)
	}
}

func TestSocketIsPrivate(t *testing.T) {
	dir := t.TempDir()
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if _, err := Listen(filepath.Join(dir, "d.sock")); !errors.Is(err, ErrSocket) {
		t.Fatalf("a directory others may enter: %v, want ErrSocket", err)
	}
	sock := serve(t, Config{})
	st, err := os.Stat(sock)
	if err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("socket mode %v, %v; want 0600", st.Mode(), err)
	}
	if _, err := Listen(sock); !errors.Is(err, ErrSocket) || !strings.Contains(err.Error(), "already listens") {
		t.Fatalf("a second daemon on the socket: %v", err)
	}
}
