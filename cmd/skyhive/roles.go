package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/skyhive/skyhive/launch"
)

// runRole runs a role from a config file for it.
type runRole func(ctx context.Context, stdout, stderr io.Writer, f launch.File) error

// roles are the roles a config file may name, by launch role name. The
// averaging peer, the pipeline worker, the expert server and the MoE
// trainer run from their typed configs, which their flags feed too; the
// others run their command with the flags the config's fields name (see
// runFlagRole).
func roles() map[string]runRole {
	byFlags := func(newCmd func() *cobra.Command) runRole {
		return func(ctx context.Context, stdout, stderr io.Writer, f launch.File) error {
			return runFlagRole(ctx, stdout, stderr, f, newCmd)
		}
	}
	return map[string]runRole{
		launch.RolePeer:       runPeerFile,
		launch.RoleWorker:     runWorkerFile,
		launch.RoleDHT:        runDHTFile,
		launch.RoleServer:     runServerFile,
		launch.RoleMoETrainer: runMoETrainerFile,
		launch.RolePipeline:   byFlags(newTrainPipelineCmd),
	}
}

// runRoleFile runs `skyhive @FILE`: the role the config file at path
// names, with its config.
func runRoleFile(ctx context.Context, path string, stdout, stderr io.Writer) error {
	f, err := launch.Read(path)
	if err != nil {
		return err
	}
	all := roles()
	run, ok := all[f.Role]
	if !ok {
		return fmt.Errorf("%s: unknown role %q (want %s)", path, f.Role, strings.Join(slices.Sorted(maps.Keys(all)), ", "))
	}
	return run(ctx, stdout, stderr, f)
}

// runPeerFile runs an averaging peer from a config file: the file's fields
// over the defaults of `skyhive peer`.
func runPeerFile(ctx context.Context, stdout, stderr io.Writer, f launch.File) error {
	c, err := peerDefaults()
	if err != nil {
		return err
	}
	if err := f.Decode(&c); err != nil { // refuses unknown fields and bad values
		return err
	}
	if err := selectProcess(c.Process); err != nil {
		return err
	}
	return runPeerRole(ctx, stdout, stderr, c)
}

// runFlagRole runs a role's command with the config file's fields as its
// flags: each field the file gives sets the flag of its name ("_" for "-"),
// the others keep their defaults, and the command runs as if given those
// flags. A negative status_every is 0 (never); gemm selects the backend as
// the root command's --gemm does.
func runFlagRole(ctx context.Context, stdout, stderr io.Writer, f launch.File, newCmd func() *cobra.Command) error {
	cfg, _ := launch.New(f.Role)
	if err := f.Decode(cfg); err != nil {
		return err
	}
	var given map[string]json.RawMessage
	if err := json.Unmarshal(f.Config, &given); err != nil {
		return fmt.Errorf("launch: %s config: %w", f.Role, err)
	}
	fields := configFields(reflect.ValueOf(cfg).Elem())
	cmd := newCmd()
	fl := cmd.Flags()
	for _, name := range slices.Sorted(maps.Keys(given)) {
		if name == "gemm" {
			continue
		}
		flag := strings.ReplaceAll(name, "_", "-")
		if fl.Lookup(flag) == nil {
			return fmt.Errorf("%s config: %q is not an option of this role", f.Role, name)
		}
		vals := flagValues(fields[name])
		if name == "status_every" && fields[name].Int() < 0 {
			vals = []string{"0s"}
		}
		for _, v := range vals {
			if err := fl.Set(flag, v); err != nil {
				return fmt.Errorf("%s config: %s: %w", f.Role, name, err)
			}
		}
	}
	if err := selectProcess(processOf(cfg)); err != nil {
		return err
	}
	cmd.SetContext(ctx)
	cmd.SetOut(stdout)
	cmd.SetErr(stderr)
	return cmd.RunE(cmd, nil)
}

// processOf returns the process options of a config that embeds them.
func processOf(cfg launch.Config) launch.Process {
	v := reflect.ValueOf(cfg).Elem()
	if p := v.FieldByName("Process"); p.IsValid() {
		if pr, ok := p.Interface().(launch.Process); ok {
			return pr
		}
	}
	return launch.Process{}
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

// flagValues are a config field's value as flag values: one per element of
// a list.
func flagValues(v reflect.Value) []string {
	if d, ok := v.Interface().(launch.Duration); ok {
		return []string{time.Duration(d).String()}
	}
	switch v.Kind() {
	case reflect.Slice:
		var out []string
		for i := range v.Len() {
			out = append(out, flagValues(v.Index(i))...)
		}
		return out
	case reflect.Bool:
		return []string{strconv.FormatBool(v.Bool())}
	case reflect.Int, reflect.Int64:
		return []string{strconv.FormatInt(v.Int(), 10)}
	case reflect.Uint64:
		return []string{strconv.FormatUint(v.Uint(), 10)}
	case reflect.Float64:
		return []string{strconv.FormatFloat(v.Float(), 'g', -1, 64)}
	}
	return []string{v.String()}
}

// selectProcess applies a config's process options that the root command's
// flags set otherwise: the GEMM backend.
func selectProcess(p launch.Process) error {
	if p.GEMM == "" {
		return selectGEMM("auto")
	}
	return selectGEMM(p.GEMM)
}

// durationVar lets a flag set a launch.Duration.
func durationVar(d *launch.Duration) *time.Duration { return (*time.Duration)(d) }

// launchStatusEvery is --status-every as a config field: 0 (never) is
// negative there, where 0 is the default.
func launchStatusEvery(every time.Duration) launch.Duration {
	if every == 0 {
		return -1
	}
	return launch.Duration(every)
}

// launchNet is the connection flags as a config's network options.
func (c *connectFlags) launchNet() launch.Net {
	return launch.Net{Listen: c.listen, Announce: c.announce, Identity: c.identity, DHT: c.dht,
		Relays: c.relays, RelayService: c.relayService, HolePunching: c.holePunching, AutoNAT: c.autoNAT,
		Reachability: c.reachability, SwarmSecret: c.swarmSecret, SwarmKey: c.swarmKey,
		MemberToken: c.memberToken, MemoryMiB: c.memoryMiB}
}

// connectFlagsOf is a config's network options as connection flags.
func connectFlagsOf(n launch.Net) connectFlags {
	return connectFlags{listen: n.Listen, announce: n.Announce, identity: n.Identity, dht: n.DHT,
		relays: n.Relays, relayService: n.RelayService, holePunching: n.HolePunching, autoNAT: n.AutoNAT,
		reachability: n.Reachability, swarmSecret: n.SwarmSecret, swarmKey: n.SwarmKey,
		memberToken: n.MemberToken, memoryMiB: n.MemoryMiB}
}
