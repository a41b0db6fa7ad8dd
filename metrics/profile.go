package metrics

import (
	"os"
	"runtime/pprof"
)

// StartCPUProfile starts a CPU profile of the process written to path (""
// does nothing: a nil stop) and returns the function that stops it and
// closes the file.
func StartCPUProfile(path string) (stop func() error, err error) {
	if path == "" {
		return nil, nil
	}
	f, err := os.Create(path)
	if err != nil {
		return nil, err
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		return nil, err
	}
	return func() error {
		pprof.StopCPUProfile()
		return f.Close()
	}, nil
}
