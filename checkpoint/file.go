package checkpoint

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/skyhive/skyhive/tensor"
)

// Save atomically writes tensors and meta to path in the format Encode
// produces. The file at path is replaced only once the new contents are
// complete and synced; see WriteAtomic.
func Save(path string, tensors map[string]*tensor.Tensor, meta map[string]string) error {
	return WriteAtomic(path, func(w io.Writer) error {
		return Encode(w, tensors, meta)
	})
}

// Load reads the checkpoint at path. Errors name the path and wrap
// ErrFormat, ErrTruncated or ErrChecksum when the file is damaged; bytes
// after the data buffer count as damage.
func Load(path string) (*File, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("checkpoint: %w", err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("checkpoint: %w", err)
	}
	if !st.Mode().IsRegular() {
		return nil, fmt.Errorf("checkpoint: load %s: not a regular file", path)
	}
	cp, n, err := decode(bufio.NewReaderSize(f, 1<<16), st.Size())
	if err != nil {
		return nil, fmt.Errorf("checkpoint: load %s: %w", path, err)
	}
	if n != st.Size() {
		return nil, fmt.Errorf("checkpoint: load %s: %w: %d bytes after the data buffer", path, ErrFormat, st.Size()-n)
	}
	return cp, nil
}

// WriteAtomic replaces the file at path with what write produces, so that
// path always holds either its old contents or the complete new ones, even
// across a crash. It writes to a temporary file in the same directory,
// fsyncs it, renames it over path and fsyncs the directory. If write or any
// step before the rename fails, the temporary file is removed and path is
// left untouched. The new file has mode 0644.
func WriteAtomic(path string, write func(io.Writer) error) (err error) {
	dir, base := filepath.Split(path)
	if dir == "" {
		dir = "."
	}
	f, err := os.CreateTemp(dir, "."+base+".tmp-*")
	if err != nil {
		return fmt.Errorf("checkpoint: save %s: %w", path, err)
	}
	tmp := f.Name()
	renamed := false
	defer func() {
		if !renamed {
			f.Close()
			if rmErr := os.Remove(tmp); rmErr != nil && !errors.Is(rmErr, os.ErrNotExist) {
				err = errors.Join(err, fmt.Errorf("checkpoint: removing temporary file: %w", rmErr))
			}
		}
	}()

	bw := bufio.NewWriterSize(f, 1<<16)
	if err := write(bw); err != nil {
		return fmt.Errorf("checkpoint: save %s: %w", path, err)
	}
	if err := bw.Flush(); err != nil {
		return fmt.Errorf("checkpoint: save %s: %w", path, err)
	}
	if err := f.Chmod(0o644); err != nil {
		return fmt.Errorf("checkpoint: save %s: %w", path, err)
	}
	if err := f.Sync(); err != nil {
		return fmt.Errorf("checkpoint: save %s: sync: %w", path, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("checkpoint: save %s: %w", path, err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return fmt.Errorf("checkpoint: save %s: %w", path, err)
	}
	renamed = true
	if err := syncDir(dir); err != nil {
		return fmt.Errorf("checkpoint: save %s: the file is in place but syncing its directory failed: %w", path, err)
	}
	return nil
}

// syncDir fsyncs a directory so a rename inside it is durable.
func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}
