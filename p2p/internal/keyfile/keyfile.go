// Package keyfile reads and writes the small secret files of a Skyhive
// peer: its identity, swarm secrets and keys, member tokens.
package keyfile

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
)

// MaxBytes bounds the identity, swarm key, secret and token files read
// from disk.
const MaxBytes = 16 << 10

// Read reads a file of at most MaxBytes bytes; a private one
// readable by group or others is refused, as ssh does. A missing file is
// an error wrapping fs.ErrNotExist.
func Read(path string, private bool) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	if private {
		st, err := f.Stat()
		if err != nil {
			return nil, err
		}
		if st.Mode().Perm()&0o077 != 0 {
			return nil, fmt.Errorf("%s has mode %v; it must not be accessible by group or others (chmod 600)", path, st.Mode().Perm())
		}
	}
	b, err := io.ReadAll(io.LimitReader(f, MaxBytes+1))
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", path, err)
	}
	if len(b) > MaxBytes {
		return nil, fmt.Errorf("%s is larger than %d bytes", path, MaxBytes)
	}
	return b, nil
}

// Write writes b to a new file at path with mode: a synced temporary
// file in the same directory, linked into place, so that a reader never
// sees a partial file. An existing file is left alone and the error wraps
// fs.ErrExist.
func Write(path string, b []byte, mode os.FileMode) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".tmp*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name()) // the link, if made, keeps the file
	if err := tmp.Chmod(mode); err != nil {
		tmp.Close()
		return err
	}
	if _, err := tmp.Write(b); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	// Link, unlike rename, fails if path exists.
	if err := os.Link(tmp.Name(), path); err != nil {
		if errors.Is(err, fs.ErrExist) {
			return fmt.Errorf("%s exists; remove it or choose another file: %w", path, fs.ErrExist)
		}
		return err
	}
	return nil
}
