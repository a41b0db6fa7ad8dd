// Package launch starts Skyhive roles in child processes with typed
// configs. A launcher writes a role's config to a file with Write (or
// Command, which also builds the command) and starts `skyhive @FILE`; the
// child reads the file with Read, decodes it into the role's config struct
// with File.Decode and runs the role. The file argument is the only thing
// a child gets on its command line, so a renamed option fails to compile in
// the launcher instead of failing the child at run time.
//
// The roles' configs (Peer, Worker, DHT, Server, MoETrainer, Pipeline)
// are in this package, which imports no other of Skyhive's, so that every
// launcher can build them: package swarm launches peers and is imported by
// the peer's package.
//
// A config file is one JSON object:
//
//	{"role": "peer", "config": {"algo": "wagma", "min_peers": 4}}
//
// Fields left out of "config" take the role's defaults (those of the
// command's flags); unknown fields are refused. Write leaves out zero
// fields, so a launcher's zero takes the default too; where a zero differs
// from the default, the field's doc says how to ask for it.
package launch

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"time"
)

// MaxFileSize bounds a config file that Read accepts.
const MaxFileSize = 1 << 20

// Prefix marks the argument that names a config file: `skyhive @FILE`.
const Prefix = "@"

// Errors of Read and Decode.
var (
	// ErrTooLarge: the file is over MaxFileSize.
	ErrTooLarge = errors.New("launch: config file too large")
	// ErrRole: the file is for another role than the one decoded into.
	ErrRole = errors.New("launch: config file is for another role")
	// ErrFormat: the file is not a valid config file.
	ErrFormat = errors.New("launch: malformed config file")
)

// Config is a role's typed configuration.
type Config interface {
	// Role names the role the config is for ("peer", "worker", ...).
	Role() string
}

// File is a config file as read: its role and the role's config, still
// encoded.
type File struct {
	Role   string          `json:"role"`
	Config json.RawMessage `json:"config"`
}

// Marshal returns the config file contents for cfg.
func Marshal(cfg Config) ([]byte, error) {
	if cfg == nil || cfg.Role() == "" {
		return nil, fmt.Errorf("%w: a config with no role", ErrFormat)
	}
	c, err := json.Marshal(cfg)
	if err != nil {
		return nil, fmt.Errorf("launch: %s config: %w", cfg.Role(), err)
	}
	b, err := json.MarshalIndent(File{Role: cfg.Role(), Config: c}, "", "  ")
	if err != nil {
		return nil, fmt.Errorf("launch: %w", err)
	}
	if len(b) > MaxFileSize {
		return nil, fmt.Errorf("%w: %d bytes", ErrTooLarge, len(b))
	}
	return append(b, '\n'), nil
}

// Write writes cfg's config file at path.
func Write(path string, cfg Config) error {
	b, err := Marshal(cfg)
	if err != nil {
		return err
	}
	if err := os.WriteFile(path, b, 0o600); err != nil {
		return fmt.Errorf("launch: %w", err)
	}
	return nil
}

// Read reads the config file at path (at most MaxFileSize bytes).
func Read(path string) (File, error) {
	f, err := os.Open(path)
	if err != nil {
		return File{}, fmt.Errorf("launch: %w", err)
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, MaxFileSize+1))
	if err != nil {
		return File{}, fmt.Errorf("launch: %s: %w", path, err)
	}
	if len(b) > MaxFileSize {
		return File{}, fmt.Errorf("%w: %s is over %d bytes", ErrTooLarge, path, MaxFileSize)
	}
	return Parse(b)
}

// Parse parses a config file's contents.
func Parse(b []byte) (File, error) {
	var f File
	if err := decodeStrict(b, &f); err != nil {
		return File{}, fmt.Errorf("%w: %w", ErrFormat, err)
	}
	if f.Role == "" || len(f.Config) == 0 {
		return File{}, fmt.Errorf("%w: want {\"role\": ..., \"config\": {...}}", ErrFormat)
	}
	return f, nil
}

// Decode decodes the file's config into cfg, a pointer to the role's config
// struct holding its defaults: the fields the file gives replace them.
// It refuses a file for another role and fields cfg does not have.
func (f File) Decode(cfg Config) error {
	if f.Role != cfg.Role() {
		return fmt.Errorf("%w: the file is for %q, not %q", ErrRole, f.Role, cfg.Role())
	}
	if err := decodeStrict(f.Config, cfg); err != nil {
		return fmt.Errorf("launch: %s config: %w", f.Role, err)
	}
	return nil
}

// decodeStrict decodes one JSON value into v, refusing unknown fields and
// anything after the value.
func decodeStrict(b []byte, v any) error {
	d := json.NewDecoder(bytes.NewReader(b))
	d.DisallowUnknownFields()
	if err := d.Decode(v); err != nil {
		return err
	}
	if d.More() {
		return errors.New("data after the config")
	}
	return nil
}

// Command writes cfg's config file at path and returns the command that
// runs exe with it: `exe @path`. The caller sets the command's
// environment, output and process attributes, starts it and owns its
// lifetime.
func Command(exe, path string, cfg Config) (*exec.Cmd, error) {
	if exe == "" || path == "" {
		return nil, errors.New("launch: Command needs an executable and a config path")
	}
	if err := Write(path, cfg); err != nil {
		return nil, err
	}
	return exec.Command(exe, Prefix+path), nil
}

// FileArg returns the config file an argument list names, if it is
// exactly one `@FILE` argument.
func FileArg(args []string) (path string, ok bool) {
	if len(args) != 1 || !strings.HasPrefix(args[0], Prefix) || len(args[0]) == len(Prefix) {
		return "", false
	}
	return args[0][len(Prefix):], true
}

// Tail returns the last n non-empty lines of the file at path (a child's
// log), joined by "; ", or "" if it cannot be read. It reads at most the
// file's last 64 KiB.
func Tail(path string, n int) string {
	f, err := os.Open(path)
	if err != nil {
		return ""
	}
	defer f.Close()
	const window = 64 << 10
	if st, err := f.Stat(); err == nil && st.Size() > window {
		if _, err := f.Seek(st.Size()-window, io.SeekStart); err != nil {
			return ""
		}
	}
	var lines []string
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 4096), window)
	for sc.Scan() {
		if l := strings.TrimSpace(sc.Text()); l != "" {
			lines = append(lines, l)
		}
	}
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "; ")
}

// Duration is a time.Duration written as a Go duration string ("90s") in
// config files; it also accepts a number of nanoseconds.
type Duration time.Duration

// MarshalText writes d as a Go duration string.
func (d Duration) MarshalText() ([]byte, error) { return []byte(time.Duration(d).String()), nil }

// UnmarshalText parses a Go duration string.
func (d *Duration) UnmarshalText(b []byte) error {
	v, err := time.ParseDuration(string(b))
	if err != nil {
		return err
	}
	*d = Duration(v)
	return nil
}

// UnmarshalJSON accepts a duration string or a number of nanoseconds.
func (d *Duration) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err == nil {
		return d.UnmarshalText([]byte(s))
	}
	var n int64
	if err := json.Unmarshal(b, &n); err != nil {
		return fmt.Errorf("want a duration such as \"90s\", got %s", b)
	}
	*d = Duration(n)
	return nil
}
