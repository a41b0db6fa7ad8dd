// Package jsonl writes JSON lines: one JSON object per line, the format of
// every --json output and --stats file of Skyhive.
package jsonl

import (
	"encoding/json"
	"io"
	"os"
)

// Open opens the file at path for appending JSON lines; with no path it
// returns a nil writer (see Writer) and a close that does nothing.
func Open(path string) (io.Writer, func() error, error) {
	if path == "" {
		return nil, func() error { return nil }, nil
	}
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, nil, err // *fs.PathError: it names the file
	}
	return f, f.Close, nil
}

// Writer writes one JSON object per line to W (nil: nowhere), ignoring
// writes after the first failed one, whose error it keeps in Err.
type Writer struct {
	W   io.Writer
	Err error
}

// Write writes v as one line, unless an earlier write failed.
func (j *Writer) Write(v any) {
	if j.W == nil || j.Err != nil {
		return
	}
	j.Err = json.NewEncoder(j.W).Encode(v)
}
