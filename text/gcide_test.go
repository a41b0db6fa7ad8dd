package text

import (
	"bytes"
	"compress/gzip"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// gcideSample imitates the start of gcide.dict: the dictd header, then
// entries with the markup LoadGCIDE strips.
const gcideSample = `

00-database-url
   ftp://ftp.gnu.org/gnu/gcide

00-database-info
   This file was converted from the original database.
GCIDE is free software; you can redistribute it.

      A dictionary containing a natural history requires too
      many hands.                                 --Locke.
Arrish \Ar"rish\, n. [See {Eddish}.]
   The stubble of wheat or grass; a stubble field; eddish.
   [Eng.] [Written also {arish}, {ersh}, etc.]
   [1913 Webster]

         The moment we entered the stubble or arrish. --Blackw.
                                                  Mag.
   [1913 Webster]

Accumulate \Ac*cu"mu*late\ (-l[asl]t), a. [L. accumulatus.]
   Collected; accumulated. --Bacon.
   [1913 Webster]

Acid process \Ac"id proc"ess\ (Chem.)
   A process in which the arri[' e]re of the [,c]a[~n]on
   is at 62[deg] F., as [beta]-naphthol, [AE]neas.
   [1913 Webster]

   Syn: zero
        [WordNet 1.5 +PJC]
`

func TestCleanGCIDE(t *testing.T) {
	got, err := CleanGCIDE(strings.NewReader(gcideSample))
	if err != nil {
		t.Fatal(err)
	}
	want := `Arrish, n. The stubble of wheat or grass; a stubble field; eddish.
The moment we entered the stubble or arrish. --Blackw. Mag.
Accumulate, a. Collected; accumulated. --Bacon.
Acid process (Chem.) A process in which the arrire of the canon is at 62 degrees F., as beta-naphthol, AEneas.
Syn: zero
`
	if string(got) != want {
		t.Errorf("cleaned text:\n%s\nwant:\n%s", got, want)
	}
}

func TestGCIDECodes(t *testing.T) {
	for code, want := range map[string]string{
		"`e": "e", "=oo": "oo", "i^": "i", "oo^": "oo", "\"o": "o", ",c": "c", "AE": "AE",
		"imac": "i", "beta": "beta", "deg": " degrees",
	} {
		if got, ok := gcideCode(code); !ok || got != want {
			t.Errorf("gcideCode(%q) = %q, %v; want %q", code, got, ok, want)
		}
	}
	for _, code := range []string{"Obs.", "R.", "1913 Webster", "L. ad + ripa", "e1", "=", "^"} {
		if got, ok := gcideCode(code); ok {
			t.Errorf("gcideCode(%q) = %q, want no code", code, got)
		}
	}
}

func TestLoadGCIDEMissing(t *testing.T) {
	_, err := LoadGCIDE(filepath.Join(t.TempDir(), "gcide.dict.dz"), 0)
	if !errors.Is(err, fs.ErrNotExist) || !strings.Contains(err.Error(), "apt-get install dict-gcide") {
		t.Fatalf("missing corpus: err = %v, want ErrNotExist with the install hint", err)
	}
}

func TestLoadGCIDECorrupt(t *testing.T) {
	path := filepath.Join(t.TempDir(), "gcide.dict.dz")
	if err := os.WriteFile(path, []byte("not gzip at all"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadGCIDE(path, 0); err == nil || !strings.Contains(err.Error(), GCIDEInstallHint) {
		t.Fatalf("corrupt corpus: err = %v, want an error with the install hint", err)
	}
}

func TestLoadGCIDEGzipped(t *testing.T) {
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	zw.Write([]byte(gcideSample))
	zw.Close()
	path := filepath.Join(t.TempDir(), "gcide.dict.dz")
	if err := os.WriteFile(path, buf.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	got, err := LoadGCIDE(path, 0)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.HasPrefix(got, []byte("Arrish, n. The stubble")) {
		t.Errorf("LoadGCIDE = %q...", got[:min(len(got), 40)])
	}
	// A bound that ends inside the header leaves no entries: an error.
	if _, err := LoadGCIDE(path, 50); !errors.Is(err, ErrEmpty) {
		t.Errorf("bounded to the header: err = %v, want ErrEmpty", err)
	}
}

// loadRealGCIDE returns the first n bytes of the installed corpus, cleaned,
// or skips the test.
func loadRealGCIDE(t testing.TB, n int64) []byte {
	t.Helper()
	if _, err := os.Stat(DefaultGCIDEPath); err != nil {
		t.Skipf("GCIDE not installed (%v); %s", err, GCIDEInstallHint)
	}
	b, err := LoadGCIDE("", n)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestLoadGCIDEReal(t *testing.T) {
	const limit = 2 << 20
	b := loadRealGCIDE(t, limit)
	if len(b) < limit/3 || len(b) > limit {
		t.Errorf("2 MiB of the database gave %d bytes of text", len(b))
	}
	for i, c := range b {
		if c >= 0x80 || c < 0x20 && c != '\n' {
			t.Fatalf("byte %#x at %d is not printable ASCII", c, i)
		}
	}
	for _, markup := range []string{"\\", "{", "}", "[", "]", "00-database", "GNU General Public License"} {
		if i := bytes.Index(b, []byte(markup)); i >= 0 {
			t.Errorf("markup %q left at %d: %q", markup, i, b[max(0, i-60):min(len(b), i+60)])
		}
	}
	if !bytes.HasPrefix(b, []byte("0 adj. 1. indicating the absence of any or all units")) {
		t.Errorf("text starts %q, want the first entry", b[:80])
	}
	if !bytes.Contains(b, []byte("\nArrival, n. 1. The act of arriving, or coming;")) {
		t.Error("the entry for Arrival is missing or not cleaned")
	}
}

func FuzzCleanGCIDE(f *testing.F) {
	f.Add([]byte(gcideSample))
	f.Add([]byte("A \\a\\ ([a^]b) [x [y] {z}\n\n"))
	f.Add([]byte("A \\a\\ (\n b \\c"))
	f.Fuzz(func(t *testing.T, in []byte) {
		out, err := CleanGCIDE(bytes.NewReader(in))
		if err != nil {
			return
		}
		for i, c := range out {
			if c >= 0x80 || c < 0x20 && c != '\n' || bytes.IndexByte([]byte("\\[]{}"), c) >= 0 {
				t.Fatalf("byte %q at %d left in %q", c, i, out)
			}
		}
		if len(out) > 2*len(in) {
			t.Fatalf("%d bytes of input grew to %d", len(in), len(out))
		}
	})
}
