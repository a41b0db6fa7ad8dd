package bridge

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// Config configures the daemon.
type Config struct {
	// Socket is the Unix socket to listen on (DefaultSocket()). Its
	// directory is created with mode 0700 if missing and must not be
	// open to others; the socket is made 0600, and a client of another
	// user is refused (SO_PEERCRED).
	Socket string
	// Once makes Serve return when its first session ends, and when no
	// client connects within AcceptTimeout: the daemon a Python process
	// starts for itself.
	Once bool
	// AcceptTimeout bounds the wait for the first client with Once (1 min).
	AcceptTimeout time.Duration
	// MaxSessions bounds the sessions served at once (4; with Once,
	// always 1): a client beyond it is told the daemon is busy.
	MaxSessions int
	// MaxElements bounds a session's model (averaging's 1<<26 elements).
	MaxElements int
	// Log receives one-line notices (nil: none).
	Log io.Writer
}

// DefaultSocket is the socket of a daemon started without one:
// $XDG_RUNTIME_DIR/skyhive/daemon.sock, else skyhive-UID/daemon.sock in
// the temporary directory.
func DefaultSocket() string {
	if d := os.Getenv("XDG_RUNTIME_DIR"); d != "" {
		return filepath.Join(d, "skyhive", "daemon.sock")
	}
	return filepath.Join(os.TempDir(), fmt.Sprintf("skyhive-%d", os.Getuid()), "daemon.sock")
}

func (c *Config) defaults() {
	if c.Socket == "" {
		c.Socket = DefaultSocket()
	}
	if c.AcceptTimeout <= 0 {
		c.AcceptTimeout = time.Minute
	}
	if c.MaxSessions <= 0 {
		c.MaxSessions = 4
	}
	if c.Once {
		c.MaxSessions = 1
	}
	if c.MaxElements <= 0 {
		c.MaxElements = 1 << 26
	}
}

// ErrSocket wraps a socket the daemon cannot listen on.
var ErrSocket = errors.New("bridge: socket")

// Listen opens cfg's socket: it creates its directory (0700) if missing,
// refuses a directory others may enter or one another user owns, replaces
// a stale socket file, and refuses a socket a daemon still listens on.
func Listen(path string) (*net.UnixListener, error) {
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrSocket, err)
	}
	var st unix.Stat_t
	if err := unix.Stat(dir, &st); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrSocket, err)
	}
	if int(st.Uid) != os.Getuid() || st.Mode&0o077 != 0 {
		return nil, fmt.Errorf("%w: directory %s must belong to you and be closed to others (chmod 700 %s), or choose another socket path", ErrSocket, dir, dir)
	}
	if _, err := os.Lstat(path); err == nil {
		if c, err := net.DialTimeout("unix", path, time.Second); err == nil {
			c.Close()
			return nil, fmt.Errorf("%w: a daemon already listens on %s; stop it or choose another socket path", ErrSocket, path)
		}
		if err := os.Remove(path); err != nil {
			return nil, fmt.Errorf("%w: stale %s: %w", ErrSocket, path, err)
		}
	}
	l, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrSocket, err)
	}
	if err := os.Chmod(path, 0o600); err != nil {
		l.Close()
		return nil, fmt.Errorf("%w: %w", ErrSocket, err)
	}
	return l, nil
}

// Serve listens on cfg.Socket and serves sessions until ctx ends (or, with
// Once, until the first session ends; it returns that session's error
// then). It removes the socket when it returns and waits for the sessions
// it started.
func Serve(ctx context.Context, cfg Config) error {
	cfg.defaults()
	l, err := Listen(cfg.Socket)
	if err != nil {
		return err
	}
	defer l.Close()
	logf(cfg.Log, "daemon listening on %s", cfg.Socket)
	var wg sync.WaitGroup
	defer wg.Wait() // after cancel: the sessions end when ctx does
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stop := context.AfterFunc(ctx, func() { l.Close() })
	defer stop()
	if cfg.Once {
		_ = l.SetDeadline(time.Now().Add(cfg.AcceptTimeout))
	}
	slots := make(chan struct{}, cfg.MaxSessions)
	var onceErr error // with Once: how the session ended
	for {
		c, err := l.AcceptUnix()
		if err != nil {
			if ctx.Err() != nil {
				wg.Wait()
				return onceErr
			}
			if errors.Is(err, os.ErrDeadlineExceeded) {
				return fmt.Errorf("%w: no client connected to %s within %v", ErrSocket, cfg.Socket, cfg.AcceptTimeout)
			}
			return fmt.Errorf("%w: %w", ErrSocket, err)
		}
		if err := checkPeer(c); err != nil {
			logf(cfg.Log, "refused a client: %v", err)
			c.Close()
			continue
		}
		select {
		case slots <- struct{}{}:
		default:
			_ = writeMessage(c, errorMessage(KindConfig, fmt.Errorf("the daemon on %s serves %d sessions already; start another daemon with its own socket", cfg.Socket, cfg.MaxSessions)), nil)
			c.Close()
			continue
		}
		if cfg.Once {
			_ = l.SetDeadline(time.Time{})
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-slots }()
			s := &session{conn: c, cfg: cfg}
			err := s.run(ctx)
			if err != nil {
				logf(cfg.Log, "session ended: %v", err)
			}
			if cfg.Once {
				onceErr = err
				cancel()
			}
		}()
	}
}

// checkPeer refuses a client of another user.
func checkPeer(c *net.UnixConn) error {
	raw, err := c.SyscallConn()
	if err != nil {
		return err
	}
	var cred *unix.Ucred
	var credErr error
	if err := raw.Control(func(fd uintptr) {
		cred, credErr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
	}); err != nil {
		return err
	}
	if credErr != nil {
		return credErr
	}
	if int(cred.Uid) != os.Getuid() {
		return fmt.Errorf("client of user %d (pid %d), the daemon's user is %d", cred.Uid, cred.Pid, os.Getuid())
	}
	return nil
}

// writeMessage sends m, with the descriptor fd (if not nil) as SCM_RIGHTS.
func writeMessage(c *net.UnixConn, m Message, fd *int) error {
	b, err := EncodeMessage(m)
	if err != nil {
		return err
	}
	if fd == nil {
		_, err = c.Write(b)
		return err
	}
	n, _, err := c.WriteMsgUnix(b, unix.UnixRights(*fd), nil)
	if err == nil && n < len(b) {
		_, err = c.Write(b[n:])
	}
	return err
}

func errorMessage(kind string, err error) Message {
	return Message{Op: OpError, Kind: kind, Error: err.Error()}
}

func logf(w io.Writer, format string, args ...any) {
	if w != nil {
		fmt.Fprintf(w, format+"\n", args...)
	}
}
