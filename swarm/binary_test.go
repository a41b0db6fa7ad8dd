package swarm

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
)

// TestBinary finds skyhive on PATH when the running executable (the test
// binary) is not skyhive, and reports ErrNoBinary when there is none.
func TestBinary(t *testing.T) {
	dir := t.TempDir()
	t.Setenv("PATH", dir)
	if _, err := Binary(); !errors.Is(err, ErrNoBinary) {
		t.Fatalf("empty PATH: %v", err)
	}
	fake := filepath.Join(dir, "skyhive")
	if err := os.WriteFile(fake, []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	if got, err := Binary(); err != nil || got != fake {
		t.Fatalf("Binary() = %q, %v; want %q", got, err, fake)
	}
}
