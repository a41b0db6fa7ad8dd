package launch

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// flagLiteral matches a string that is, or starts with, a command-line
// flag ("--dht", "--shard=0/4").
var flagLiteral = regexp.MustCompile(`^--[a-z]`)

// allowedFlagLiterals are reviewed flag strings outside cmd/ that launch
// nothing of skyhive's (file: literal).
var allowedFlagLiterals = map[string]bool{
	// The pytorch suite runs the Python package's benchmark, a program of
	// its own (python3 -m skyhive.bench), not a skyhive role.
	"bench/pytorch.go: --reps":  true,
	"bench/pytorch.go: --quick": true,
	// The executor is a Python program (python3 -m skyhive.executor)
	// that a role starts with its two inherited descriptors.
	"bridge/executor.go: --control-fd": true,
	"bridge/executor.go: --shm-fd":     true,
	"bridge/executor.go: --shm-bytes":  true,
}

// TestNoFlagStringsOutsideCmd: only the command (cmd/) builds command
// lines; every other package launches skyhive roles with typed configs
// through this package. A flag string literal in a non-test Go file outside
// cmd/ fails this test: launch the role with its config instead.
func TestNoFlagStringsOutsideCmd(t *testing.T) {
	root := ".."
	n := 0
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, path)
		if d.IsDir() {
			if rel == "cmd" || (rel != "." && strings.HasPrefix(d.Name(), ".")) || d.Name() == "testdata" {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(token.NewFileSet(), path, nil, 0)
		if err != nil {
			return err
		}
		n++
		ast.Inspect(f, func(node ast.Node) bool {
			lit, ok := node.(*ast.BasicLit)
			if !ok || lit.Kind != token.STRING {
				return true
			}
			s, err := strconv.Unquote(lit.Value)
			if err == nil && flagLiteral.MatchString(s) && !allowedFlagLiterals[rel+": "+s] {
				t.Errorf("%s: flag string %q: launch skyhive roles with typed configs (package launch), not command lines", rel, s)
			}
			return true
		})
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if n < 50 {
		t.Fatalf("only %d Go files outside cmd/: the walk did not see the module", n)
	}
}
