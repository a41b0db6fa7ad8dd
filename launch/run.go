package launch

import (
	"context"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
)

// Runner runs a role from a config file for it: its results on stdout,
// its progress and notices on stderr.
type Runner func(ctx context.Context, stdout, stderr io.Writer, f File) error

// configOf is a pointer to a role's config C, which has process options.
type configOf[C any] interface {
	*C
	Config
	ProcessOptions() Process
}

// FileRunner returns the Runner of a role whose config is C: the file's
// fields over defaults (the role's options when none is given), then
// prepare with the config's process options (e.g. to select its GEMM
// backend), then run with the config.
func FileRunner[C any, P configOf[C]](defaults func() C, prepare func(Process) error,
	run func(ctx context.Context, stdout, stderr io.Writer, c C) error) Runner {
	return func(ctx context.Context, stdout, stderr io.Writer, f File) error {
		c := defaults()
		if err := f.Decode(P(&c)); err != nil { // refuses unknown fields and bad values
			return err
		}
		if err := prepare(P(&c).ProcessOptions()); err != nil {
			return err
		}
		return run(ctx, stdout, stderr, c)
	}
}

// RunFile runs the role that the config file at path names with its
// runner in runners, by role name.
func RunFile(ctx context.Context, path string, stdout, stderr io.Writer, runners map[string]Runner) error {
	f, err := Read(path)
	if err != nil {
		return err
	}
	run, ok := runners[f.Role]
	if !ok {
		return fmt.Errorf("%s: unknown role %q (want %s)", path, f.Role, strings.Join(slices.Sorted(maps.Keys(runners)), ", "))
	}
	return run(ctx, stdout, stderr, f)
}
