package swarm

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// ErrNoBinary is returned by Binary when no skyhive executable is found.
var ErrNoBinary = errors.New("swarm: no skyhive executable to launch workers with: run this as a skyhive command or put skyhive on PATH")

// Binary returns the skyhive executable that local worker processes are
// started from (PipelineLaunch.Binary): this process's own executable when
// it is skyhive (the CLI's benchmarks and experiments), otherwise skyhive
// on PATH. It returns ErrNoBinary when there is neither.
func Binary() (string, error) {
	exe, err := os.Executable()
	if err == nil && strings.HasPrefix(filepath.Base(exe), "skyhive") {
		return exe, nil
	}
	if p, err := exec.LookPath("skyhive"); err == nil {
		return p, nil
	}
	return "", ErrNoBinary
}
