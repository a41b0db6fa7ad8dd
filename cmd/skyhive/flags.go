package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"time"

	"github.com/spf13/pflag"

	"github.com/skyhive/skyhive/data"
	"github.com/skyhive/skyhive/netem"
)

// Flag groups shared by the commands, so that one name means one thing,
// in one unit, everywhere:
//
//   - output: --json (the result as JSON on stdout) and --stats FILE (JSON
//     lines appended while the command runs);
//   - connectivity: --dht (peers of the swarm's DHT to join), --listen,
//     --announce, --identity;
//   - emulated links: --latency (one-way, a Go duration) and --bandwidth
//     (Mbit/s), as in netem's region profiles;
//   - data: --data-dir and --limit.

// outputFlags are --json and --stats.
type outputFlags struct {
	json  bool
	stats string
}

// register adds --json and --stats; result says what --json prints, lines
// what --stats appends (and when).
func (o *outputFlags) register(fl *pflag.FlagSet, result, lines string) {
	fl.BoolVar(&o.json, "json", false, "print "+result+" as JSON on stdout")
	fl.StringVar(&o.stats, "stats", "", "append JSON lines to this file: "+lines)
}

// openStats opens --stats for appending; it returns a nil writer and a
// no-op close without --stats.
func (o *outputFlags) openStats() (io.Writer, func() error, error) {
	if o.stats == "" {
		return nil, func() error { return nil }, nil
	}
	f, err := os.OpenFile(o.stats, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, nil, fmt.Errorf("--stats: %w", err)
	}
	return f, f.Close, nil
}

// jsonLines writes one JSON object per line to w (nil: nowhere), ignoring
// write errors after the first, which it keeps.
type jsonLines struct {
	w   io.Writer
	err error
}

func (j *jsonLines) write(v any) {
	if j.w == nil || j.err != nil {
		return
	}
	j.err = json.NewEncoder(j.w).Encode(v)
}

// printJSON prints v as indented JSON.
func printJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// linkFlags describe one emulated link: --latency and --bandwidth.
type linkFlags struct {
	latency   time.Duration
	bandwidth float64 // Mbit/s
}

// register adds --latency (default latency) and --bandwidth; what says
// which link they emulate.
func (l *linkFlags) register(fl *pflag.FlagSet, what string, latency time.Duration) {
	fl.DurationVar(&l.latency, "latency", latency, "emulated one-way latency "+what+" (0: none)")
	fl.Float64Var(&l.bandwidth, "bandwidth", 0, "emulated bandwidth "+what+", Mbit/s (0: unlimited)")
}

// set reports whether any emulation was asked for.
func (l linkFlags) set() bool { return l.latency != 0 || l.bandwidth != 0 }

// params returns the link, or an error naming the flag at fault.
func (l linkFlags) params() (netem.LinkParams, error) {
	if l.latency < 0 || l.bandwidth < 0 {
		return netem.LinkParams{}, errors.New("--latency and --bandwidth must not be negative")
	}
	return netem.LinkParams{Latency: l.latency, Bandwidth: l.bandwidth * 1e6}, nil
}

// dataFlags locate Fashion-MNIST and bound the training set.
type dataFlags struct {
	dir   string
	limit int
}

func (d *dataFlags) register(fl *pflag.FlagSet) {
	fl.StringVar(&d.dir, "data-dir", data.DefaultDir, "directory holding the Fashion-MNIST IDX files")
	fl.IntVar(&d.limit, "limit", 0, "use only the first N training examples (0 = all)")
}

// load reads the training set (--limit applied) and the test set.
func (d dataFlags) load() (trainSet, testSet *data.Dataset, err error) {
	if d.limit < 0 {
		return nil, nil, fmt.Errorf("--limit must not be negative, got %d", d.limit)
	}
	if trainSet, err = data.LoadFashionMNIST(d.dir, data.Train, data.LoadOptions{Standardize: true, Limit: d.limit}); err != nil {
		return nil, nil, err
	}
	testSet, err = data.LoadFashionMNIST(d.dir, data.Test, data.LoadOptions{Standardize: true})
	return trainSet, testSet, err
}

// legacyTrainArgs rewrites the retired `skyhive train --mode MODE …` into
// `skyhive train MODE …` and says so on warn; other argument lists come
// back unchanged.
func legacyTrainArgs(args []string, warn io.Writer) []string {
	i := 0 // the first positional argument, after the global flags
	for i < len(args) && len(args[i]) > 1 && args[i][0] == '-' {
		if args[i] == "--gemm" || args[i] == "--cpuprofile" {
			i++
		}
		i++
	}
	if i >= len(args) || args[i] != "train" {
		return args
	}
	for j := i + 1; j < len(args); j++ {
		var mode string
		var n int
		switch a := args[j]; {
		case a == "--mode" && j+1 < len(args):
			mode, n = args[j+1], 2
		case len(a) > 7 && a[:7] == "--mode=":
			mode, n = a[7:], 1
		default:
			continue
		}
		out := slices.Concat(args[:i+1], []string{mode}, args[i+1:j], args[j+n:])
		fmt.Fprintf(warn, "skyhive: --mode is retired; running `skyhive train %s` (see skyhive train --help)\n", mode)
		return out
	}
	return args
}
