package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

// docCommand is one `skyhive …` command line found in the documentation.
type docCommand struct {
	file string // relative to the repository root
	line int
	// block numbers the fenced code block the line is in.
	block int
	text  string   // the command as written, continuations joined
	args  []string // its arguments after "skyhive", comments removed
	// synopsis is set for usage patterns ("[--algo A|B]", "FILE...")
	// rather than runnable examples: only their flag names are checked.
	synopsis bool
}

// docFiles are the files whose command lines TestDocumentedCommands checks.
func docFiles(t *testing.T) []string {
	t.Helper()
	files, err := filepath.Glob("../../docs/*.md")
	if err != nil {
		t.Fatal(err)
	}
	return append([]string{"../../README.md"}, files...)
}

// docCommands reads the `skyhive` command lines of the fenced code blocks
// of a Markdown file.
func docCommands(path string) ([]docCommand, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	return scanCommands(path, strings.Split(string(b), "\n"), true), nil
}

// scanCommands returns the `skyhive` command lines among lines (only
// those inside fenced code blocks if fenced), with backslash continuations
// joined.
func scanCommands(file string, lines []string, fenced bool) []docCommand {
	var out []docCommand
	inBlock := !fenced
	var cur *docCommand
	block := 0
	for i, line := range lines {
		trimmed := strings.TrimSpace(line)
		if fenced && strings.HasPrefix(trimmed, "```") {
			inBlock, cur = !inBlock, nil
			block++
			continue
		}
		if !inBlock {
			continue
		}
		if cur != nil { // a continuation of the previous line
			cur.text += " " + strings.TrimSuffix(trimmed, `\`)
			if !strings.HasSuffix(trimmed, `\`) {
				out = append(out, *cur)
				cur = nil
			}
			continue
		}
		cmd, ok := docCommandText(trimmed)
		if !ok {
			continue
		}
		c := docCommand{file: file, line: i + 1, block: block, text: strings.TrimSuffix(cmd, `\`)}
		if strings.HasSuffix(cmd, `\`) {
			cur = &c
			continue
		}
		out = append(out, c)
	}
	return out
}

// docCommandText returns the command of a code line that runs skyhive:
// "skyhive …", "./bin/skyhive …", "sudo skyhive …", "srun skyhive …",
// "$ skyhive …" (not output lines that merely start with the word).
func docCommandText(line string) (string, bool) {
	line = strings.TrimPrefix(line, "$ ")
	for _, p := range []string{"sudo ", "srun ", "./bin/", "bin/"} {
		line = strings.TrimPrefix(line, p)
	}
	if !strings.HasPrefix(line, "skyhive ") {
		return "", false
	}
	rest := strings.Fields(line)[1]
	// Output lines (tables of results) start with a strategy name and a
	// number; commands start with a subcommand or a flag.
	if rest[0] >= '0' && rest[0] <= '9' {
		return "", false
	}
	return line, true
}

// shellWords splits a command line as a shell would for the cases the
// docs use: single and double quotes, a trailing comment, a pipe or
// redirection ending the command.
func shellWords(s string) []string {
	var words []string
	var w strings.Builder
	inWord := false
	var quote rune
	for _, r := range s {
		switch {
		case quote != 0:
			if r == quote {
				quote = 0
			} else {
				w.WriteRune(r)
			}
		case r == '\'' || r == '"':
			quote, inWord = r, true
		case r == ' ' || r == '\t':
			if inWord {
				words = append(words, w.String())
				w.Reset()
				inWord = false
			}
		case (r == '#' || r == '|' || r == '>' || r == '&') && !inWord:
			return words
		default:
			w.WriteRune(r)
			inWord = true
		}
	}
	if inWord {
		words = append(words, w.String())
	}
	return words
}

// isSynopsis reports whether a command line is a usage pattern ("[--algo
// A|B]", "FILE...") rather than a runnable example. Quoted text (an expert
// grid such as 'ffn.[0:16]') and shell pipes (" | jq") do not count.
func isSynopsis(line string) bool {
	var b strings.Builder
	var quote rune
	for _, r := range line {
		switch {
		case quote != 0:
			if r == quote {
				quote = 0
			}
		case r == '\'' || r == '"':
			quote = r
		case r == '#':
			return synopsisMarks(b.String())
		default:
			b.WriteRune(r)
		}
	}
	return synopsisMarks(b.String())
}

func synopsisMarks(s string) bool {
	s = strings.ReplaceAll(s, " | ", " ")
	return strings.ContainsAny(s, "[]…|") || strings.Contains(s, "...")
}

// allDocCommands gathers the command lines of every documentation file.
func allDocCommands(t *testing.T) []docCommand {
	t.Helper()
	var all []docCommand
	for _, f := range docFiles(t) {
		cs, err := docCommands(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range cs {
			c.file = strings.TrimPrefix(f, "../../")
			c.args = shellWords(c.text)[1:]
			c.synopsis = isSynopsis(c.text)
			all = append(all, c)
		}
		usageBlocks(all[len(all)-len(cs):])
	}
	return all
}

// usageBlocks marks every command of a code block as a usage pattern when
// most of them are: such a block lists a command's forms ("dht get --dht
// MA/p2p/ID KEY" beside "dht [--listen MA,...]"), not steps to run.
func usageBlocks(cs []docCommand) {
	usage, total := map[int]int{}, map[int]int{}
	for _, c := range cs {
		total[c.block]++
		if c.synopsis {
			usage[c.block]++
		}
	}
	for i := range cs {
		b := cs[i].block
		cs[i].synopsis = cs[i].synopsis || 2*usage[b] > total[b]
	}
}

// checkDocCommand parses one documented command line with a fresh command
// tree: the subcommand must exist and every flag must be known; a runnable
// example's flag values must parse and its positional arguments be
// accepted.
func checkDocCommand(c docCommand) error {
	root := newRootCmd()
	args := legacyTrainArgs(c.args, new(strings.Builder))
	cmd, rest, err := root.Find(args)
	if err != nil {
		return err
	}
	if cmd == root {
		return fmt.Errorf("no such command %q", strings.Join(args, " "))
	}
	if c.synopsis {
		return checkFlagNames(cmd, rest)
	}
	if err := cmd.ParseFlags(rest); err != nil {
		return err
	}
	if cmd.Args != nil {
		return cmd.ValidateArgs(cmd.Flags().Args())
	}
	return nil
}

// checkFlagNames checks that every --flag named in a usage pattern exists.
func checkFlagNames(cmd *cobra.Command, words []string) error {
	fl := cmd.Flags()
	fl.AddFlagSet(cmd.InheritedFlags())
	for _, w := range words {
		w = strings.TrimLeft(w, "[")
		if !strings.HasPrefix(w, "--") {
			continue
		}
		name := strings.TrimPrefix(w, "--")
		name, _, _ = strings.Cut(name, "=")
		name = strings.TrimRight(name, "]")
		if name == "" {
			continue
		}
		if fl.Lookup(string(fl.GetNormalizeFunc()(fl, name))) == nil {
			return fmt.Errorf("unknown flag --%s", name)
		}
	}
	return nil
}

// TestDocumentedCommands checks every `skyhive` command line in README.md
// and docs/*.md against the command tree: a renamed command or flag, or a
// value that no longer parses, fails here rather than for a user.
func TestDocumentedCommands(t *testing.T) {
	cmds := allDocCommands(t)
	if len(cmds) < 50 {
		t.Fatalf("found only %d documented command lines; the extraction is broken", len(cmds))
	}
	for _, c := range cmds {
		if err := checkDocCommand(c); err != nil {
			t.Errorf("%s:%d: %s\n\t%v", c.file, c.line, c.text, err)
		}
	}
}

// TestHelpExamples checks the examples of every command's --help the same
// way.
func TestHelpExamples(t *testing.T) {
	var n int
	var walk func(c *cobra.Command)
	walk = func(c *cobra.Command) {
		for _, dc := range scanCommands(c.CommandPath(), strings.Split(c.Example, "\n"), false) {
			n++
			dc.args = shellWords(dc.text)[1:]
			dc.synopsis = isSynopsis(dc.text)
			if err := checkDocCommand(dc); err != nil {
				t.Errorf("example line %d of %q: %s\n\t%v", dc.line, dc.file, dc.text, err)
			}
		}
		for _, sub := range c.Commands() {
			walk(sub)
		}
	}
	walk(newRootCmd())
	if n < 20 {
		t.Fatalf("found only %d examples in the commands' help; the extraction is broken", n)
	}
}

// TestDocCommandExtraction pins the parsing rules on lines like the docs'.
func TestDocCommandExtraction(t *testing.T) {
	got := shellWords(`skyhive server --experts 'ffn.[0:16].[0:16]' --dht ADDR   # a comment`)
	want := []string{"skyhive", "server", "--experts", "ffn.[0:16].[0:16]", "--dht", "ADDR"}
	if strings.Join(got, "\x00") != strings.Join(want, "\x00") {
		t.Fatalf("shellWords = %q, want %q", got, want)
	}
	if isSynopsis(`skyhive server --experts 'ffn.[0:16].[0:16]' --dht ADDR   # [a comment]`) {
		t.Error("a quoted grid range was taken for a usage pattern")
	}
	if !isSynopsis("skyhive peer --dht ADDR [--algo wagma|allreduce]") {
		t.Error("a usage pattern was taken for an example")
	}
	if _, ok := docCommandText("skyhive       0.8550        0.4327    7.69×"); ok {
		t.Error("an output line was taken for a command")
	}
	block := []docCommand{{block: 1, synopsis: true}, {block: 1}, {block: 1, synopsis: true}, {block: 2, synopsis: true}, {block: 2}, {block: 2}}
	usageBlocks(block)
	if !block[1].synopsis || block[4].synopsis || block[5].synopsis {
		t.Errorf("usage blocks: %+v (block 1 is mostly usage, block 2 mostly examples)", block)
	}
	bad := docCommand{args: []string{"train", "pipeline", "--no-such-flag", "3"}}
	if checkDocCommand(bad) == nil {
		t.Error("an unknown flag was accepted")
	}
	bad = docCommand{args: []string{"no-such-command"}}
	if checkDocCommand(bad) == nil {
		t.Error("an unknown command was accepted")
	}
}

// TestFlagUsageHasNoBackquotes: pflag takes a `quoted` word of a flag's
// usage as the name of its value in --help ("--hidden train moe"), so
// usages quote nothing that way.
func TestFlagUsageHasNoBackquotes(t *testing.T) {
	var walk func(c *cobra.Command)
	walk = func(c *cobra.Command) {
		c.LocalFlags().VisitAll(func(f *pflag.Flag) {
			if strings.Contains(f.Usage, "`") {
				t.Errorf("%s --%s: usage %q has a backquote", c.CommandPath(), f.Name, f.Usage)
			}
		})
		for _, sub := range c.Commands() {
			walk(sub)
		}
	}
	walk(newRootCmd())
}
