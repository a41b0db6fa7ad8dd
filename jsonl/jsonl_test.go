package jsonl

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
)

type failing struct{}

func (failing) Write([]byte) (int, error) { return 0, errors.New("disk full") }

// Lines append to the file, a nil writer writes nowhere, and the first
// failure is kept while later writes are skipped.
func TestWriter(t *testing.T) {
	path := filepath.Join(t.TempDir(), "s.jsonl")
	for range 2 {
		w, closeFile, err := Open(path)
		if err != nil {
			t.Fatal(err)
		}
		j := Writer{W: w}
		j.Write(map[string]int{"a": 1})
		if err := closeFile(); err != nil || j.Err != nil {
			t.Fatal(err, j.Err)
		}
	}
	b, err := os.ReadFile(path)
	if err != nil || string(b) != "{\"a\":1}\n{\"a\":1}\n" {
		t.Fatalf("file holds %q (%v), want two appended lines", b, err)
	}
	w, closeFile, err := Open("")
	if w != nil || err != nil || closeFile() != nil {
		t.Fatal("no path: want a nil writer and a no-op close")
	}
	(&Writer{}).Write(1) // nowhere, no panic
	j := Writer{W: failing{}}
	j.Write(1)
	first := j.Err
	j.Write(2)
	if first == nil || j.Err != first {
		t.Fatalf("errors %v then %v, want the first kept", first, j.Err)
	}
}
