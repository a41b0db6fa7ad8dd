package swarm

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/skyhive/skyhive/launch"
)

// neverJoined is a coordinator that no worker ever registers with.
type neverJoined struct{}

func (neverJoined) JoinAddr(name, region string) (string, error) { return "/ip4/127.0.0.1/tcp/1", nil }
func (neverJoined) LiveWorkers() int                             { return 0 }
func (neverJoined) WaitWorkers(ctx context.Context, n int) error {
	<-ctx.Done()
	return ctx.Err()
}

// A worker that fails before registering fails the launch with the end
// of its own output; its config file holds its typed config.
func TestLaunchPipelineWorkersShowsWorkerOutput(t *testing.T) {
	dir := t.TempDir()
	// sh cannot open the script "@FILE": it says so on stderr and exits.
	_, err := LaunchPipelineWorkers(context.Background(), neverJoined{}, PipelineLaunch{
		Binary: "/bin/sh", Slowdowns: []float64{2}, Worker: launch.Worker{Steady: true},
		Dir: dir, JoinTimeout: time.Second,
	})
	if err == nil || !strings.Contains(err.Error(), "w0's output ends") || !strings.Contains(err.Error(), "w0.launch.json") {
		t.Fatalf("got %v, want the worker's own error", err)
	}
	f, err := launch.Read(filepath.Join(dir, "w0.launch.json"))
	if err != nil {
		t.Fatal(err)
	}
	var w launch.Worker
	if err := f.Decode(&w); err != nil {
		t.Fatal(err)
	}
	if w.Name != "w0" || w.Slowdown != 2 || !w.Steady || w.Join != "/ip4/127.0.0.1/tcp/1" {
		t.Errorf("config %+v", w)
	}
	if _, err := os.Stat(filepath.Join(dir, "w0.launch.log")); err != nil {
		t.Error(err)
	}
}
