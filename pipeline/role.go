package pipeline

import (
	"context"
	"encoding/json"
	"fmt"
	"io"

	"github.com/skyhive/skyhive/jsonl"
	"github.com/skyhive/skyhive/launch"
	"github.com/skyhive/skyhive/metrics"
	"github.com/skyhive/skyhive/p2p"
)

// DecodeLaunch decodes a coordinator's config file over c (the defaults of
// `skyhive train pipeline`), refusing unknown fields, bad values and a
// region, which a coordinator has none of. given reports whether the file
// gives an option, by its JSON name, for FromLaunch.
func DecodeLaunch(f launch.File, c *launch.Pipeline) (given func(field string) bool, err error) {
	if err := f.Decode(c); err != nil {
		return nil, err
	}
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(f.Config, &fields); err != nil {
		return nil, fmt.Errorf("launch: %s config: %w", f.Role, err)
	}
	if _, ok := fields["region"]; ok {
		return nil, fmt.Errorf("%s config: %q is not an option of this role", f.Role, "region")
	}
	return func(field string) bool { _, ok := fields[field]; return ok }, nil
}

// RunRole runs a coordinator process's role: Train with cfg (FromLaunch's,
// with the host and the workers' binary added), its statistics appended to
// the file stats ("": none), its Prometheus metrics served on metricsAddr
// ("": none) and where workers reach it reported to log. Errors about
// stats and metricsAddr are *launch.FieldError.
func RunRole(ctx context.Context, cfg TrainConfig, stats, metricsAddr string, stdout, log io.Writer) error {
	w, closeStats, err := jsonl.Open(stats)
	if err != nil {
		return launch.NewFieldError(err, "%s", "stats")
	}
	defer closeStats()
	reg, stopMetrics, err := metrics.Start(ctx, metricsAddr, log)
	if err != nil {
		return launch.NewFieldError(err, "%s", "metrics")
	}
	defer stopMetrics()
	cfg.Stats = w
	cfg.Node.Metrics, cfg.Scenario.Coordinator.Metrics, cfg.Scenario.Coordinator.Host.Metrics = reg.Registerer(), reg.Registerer(), reg.Registerer()
	cfg.Announce = func(ctx context.Context, h *p2p.Host) { p2p.ReportReach(ctx, h, log, nil) }
	return Train(ctx, cfg, stdout, log)
}

// RunDemo runs the demo as a command does: Demo with cfg (checked first),
// its statistics appended to the file stats ("": none), its steps on
// stdout, or with asJSON on log and the result as JSON on stdout. Errors
// about cfg's options and stats are *launch.FieldError.
func RunDemo(ctx context.Context, cfg DemoConfig, stats string, asJSON bool, stdout, log io.Writer) error {
	if err := cfg.Check(); err != nil {
		return err
	}
	w, closeStats, err := jsonl.Open(stats)
	if err != nil {
		return launch.NewFieldError(err, "%s", "stats")
	}
	defer closeStats()
	cfg.Stats = w
	out := stdout
	if asJSON {
		out = log
	}
	res, err := Demo(ctx, cfg, out, log)
	if err != nil || !asJSON {
		return err
	}
	enc := json.NewEncoder(stdout)
	enc.SetIndent("", "  ")
	return enc.Encode(res)
}
