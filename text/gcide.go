package text

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"strings"
)

// DefaultGCIDEPath is where Debian's dict-gcide package installs the
// Collaborative International Dictionary of English, a dictd database
// compressed with dictzip (which gzip can read).
const DefaultGCIDEPath = "/usr/share/dictd/gcide.dict.dz"

// GCIDEInstallHint tells the user how to get the GCIDE corpus.
const GCIDEInstallHint = "install the GCIDE dictionary with `apt-get install dict-gcide` (or `make setup`)"

// DefaultMaxBytes is the read bound LoadGCIDE and ReadTextFile use when they
// are given a non-positive one. The whole of GCIDE (about 40 MB
// uncompressed) fits.
const DefaultMaxBytes = 64 << 20

// maxGCIDELine bounds one line of the dictd file; GCIDE's longest is far
// shorter, so a longer one means the file is not a dictd database.
const maxGCIDELine = 1 << 20

// LoadGCIDE reads the GCIDE dictd database at path (DefaultGCIDEPath when
// path is empty) and returns its entries as plain English text, one
// paragraph per line. At most maxBytes bytes of the decompressed database
// are read (DefaultMaxBytes when maxBytes <= 0), so a small maxBytes gives a
// prefix of the corpus (the entries of the first letters). The gzip checksum
// is verified only when the whole file is read.
//
// The dictd markup is stripped so that what is left reads as prose:
//
//   - the database header (the 00-database-* entries and the license text
//     before the first headword) is skipped;
//   - pronunciation fields (\Ar*rive"\) and the respelling in parentheses
//     that may follow them are removed;
//   - GCIDE's character codes are replaced by ASCII: accented letters
//     ([`e], [=a], [i^], ["o], [,c], ...) by the bare letter, ligatures
//     ([ae], [OE]) by two letters, Greek letter names ([beta]) by the name,
//     and a few symbols ([deg], [sect]) by words;
//   - every other bracketed span is removed: etymologies ([L. arridere ...]),
//     usage labels ([Obs.], [R.]), source tags ([1913 Webster],
//     [WordNet 1.5 +PJC]) and editorial insertions;
//   - cross-reference braces ({Arrive}) are removed, keeping the word;
//   - the lines of a paragraph are joined and runs of spaces collapsed;
//     stray Windows-1252 quotes become ASCII quotes and other non-ASCII
//     bytes are dropped.
//
// Field labels such as (Chem.), quotations and their attributions
// (--Shak.), and "Syn:" lists are kept. A missing file gives an error that
// says how to install it.
func LoadGCIDE(path string, maxBytes int64) ([]byte, error) {
	if path == "" {
		path = DefaultGCIDEPath
	}
	if maxBytes <= 0 {
		maxBytes = DefaultMaxBytes
	}
	f, err := os.Open(path)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil, fmt.Errorf("text: GCIDE corpus %s not found; %s: %w", path, GCIDEInstallHint, err)
		}
		return nil, fmt.Errorf("text: %s: %w", path, err)
	}
	defer f.Close()
	zr, err := gzip.NewReader(bufio.NewReaderSize(f, 1<<16))
	if err != nil {
		return nil, fmt.Errorf("text: %s is not a gzip/dictzip file (%w); reinstall it: %s", path, err, GCIDEInstallHint)
	}
	defer zr.Close()
	out, err := CleanGCIDE(io.LimitReader(zr, maxBytes))
	if err != nil {
		return nil, fmt.Errorf("text: %s: %w; reinstall it: %s", path, err, GCIDEInstallHint)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("text: %s: %w: no dictionary entries in the first %d bytes", path, ErrEmpty, maxBytes)
	}
	return out, nil
}

// CleanGCIDE turns an uncompressed GCIDE dictd database into plain text as
// LoadGCIDE describes, reading r to its end. Callers bound r.
func CleanGCIDE(r io.Reader) ([]byte, error) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 1<<16), maxGCIDELine)
	var out, para []byte
	started := false
	flush := func() {
		if len(para) > 0 {
			if p := cleanParagraph(para); len(p) > 0 {
				out = append(append(out, p...), '\n')
			}
			para = para[:0]
		}
	}
	for sc.Scan() {
		line := sc.Bytes()
		if !started {
			// Entries proper begin with the first headword line: text at
			// column 0 with a \pronunciation\ field. Everything before it
			// is the dictd header and the license.
			if len(line) == 0 || line[0] == ' ' || line[0] == '\t' || bytes.Count(line, []byte{'\\'}) < 2 {
				continue
			}
			started = true
		}
		line = bytes.TrimSpace(line)
		if len(line) == 0 {
			flush()
			continue
		}
		para = append(append(para, line...), ' ')
	}
	if err := sc.Err(); err != nil {
		if errors.Is(err, bufio.ErrTooLong) {
			return nil, fmt.Errorf("a line longer than %d bytes; not a dictd database", maxGCIDELine)
		}
		return nil, err
	}
	flush()
	return out, nil
}

// cleanParagraph strips the markup from one joined paragraph.
func cleanParagraph(p []byte) []byte {
	out := make([]byte, 0, len(p))
	for i := 0; i < len(p); i++ {
		switch c := p[i]; c {
		case '\\':
			end := bytes.IndexByte(p[i+1:], '\\')
			if end < 0 {
				continue // an unpaired backslash: drop it
			}
			i += end + 1
			// A respelling may follow: "(-l[asl]t)", "([a^]k`kl...)".
			// Field labels such as "(Chem.)" start with a capital; keep them.
			j := i + 1
			for j < len(p) && p[j] == ' ' {
				j++
			}
			if j+1 < len(p) && p[j] == '(' && !isUpper(p[j+1]) {
				if k := bytes.IndexByte(p[j:], ')'); k >= 0 {
					i = j + k
				}
			}
		case '[':
			end := matchingBracket(p, i)
			if end < 0 {
				continue // unpaired: drop the bracket
			}
			if rep, ok := gcideCode(string(p[i+1 : end])); ok {
				out = append(out, rep...)
			}
			i = end
		case '{', '}', ']':
		case '\t', '\r', '\n':
			out = append(out, ' ')
		case 0x91, 0x92:
			out = append(out, '\'')
		case 0x93, 0x94:
			out = append(out, '"')
		default:
			if c >= 0x20 && c < 0x7f {
				out = append(out, c)
			}
		}
	}
	return tidy(out)
}

// tidy collapses runs of spaces, removes spaces before , ; : . and empty
// parentheses left behind by removed markup, and trims the ends.
func tidy(b []byte) []byte {
	out := b[:0]
	for i := 0; i < len(b); i++ {
		c := b[i]
		switch {
		case c == ' ' && (len(out) == 0 || out[len(out)-1] == ' ' || out[len(out)-1] == '('):
			continue
		case (c == ',' || c == ';' || c == '.' || c == ':' || c == ')') && len(out) > 0 && out[len(out)-1] == ' ':
			out = out[:len(out)-1]
		}
		if c == ')' && len(out) > 0 && out[len(out)-1] == '(' {
			out = out[:len(out)-1]
			continue
		}
		out = append(out, c)
	}
	out = bytes.TrimSpace(out)
	// A paragraph reduced to punctuation carried no text.
	if bytes.IndexFunc(out, func(r rune) bool { return r < 0x80 && (isLetter(byte(r)) || isDigit(byte(r))) }) < 0 {
		return nil
	}
	return out
}

// matchingBracket returns the index of the ']' closing the '[' at p[i],
// allowing nesting, or -1.
func matchingBracket(p []byte, i int) int {
	depth := 0
	for j := i; j < len(p); j++ {
		switch p[j] {
		case '[':
			depth++
		case ']':
			depth--
			if depth == 0 {
				return j
			}
		}
	}
	return -1
}

// gcideNamed maps GCIDE's named character codes to ASCII.
func gcideNamed(code string) (string, bool) {
	switch code {
	case "imac":
		return "i", true
	case "aum", "asl", "add", "als":
		return "a", true
	case "udd":
		return "u", true
	case "eth", "thorn", "th":
		return "th", true
	case "yogh":
		return "y", true
	case "deg":
		return " degrees", true
	case "sect":
		return "section ", true
	case "pounds":
		return "pounds ", true
	case "times":
		return "x", true
	case "frac12":
		return "1/2", true
	case "frac13":
		return "1/3", true
	case "frac14":
		return "1/4", true
	case "frac23":
		return "2/3", true
	case "frac34":
		return "3/4", true
	case "ldqo", "rdqo":
		return "\"", true
	case "rsquo":
		return "'", true
	case "nbsp":
		return " ", true
	case "middot":
		return ".", true
	case "divby", "div":
		return "/", true
	case "filig":
		return "fi", true
	case "fllig":
		return "fl", true
	case "ffllig":
		return "ffl", true
	case "ccaron", "cacute":
		return "c", true
	case "zdot":
		return "z", true
	case "mdot":
		return "m", true
	case "ae", "AE", "oe", "OE", "ng", "alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta", "iota", "kappa", "lambda", "mu", "nu", "xi", "omicron", "pi", "rho", "sigma", "tau", "upsilon", "phi", "chi", "psi", "omega":
		return code, true
	}
	return "", false
}

// gcideCode returns the ASCII replacement of the bracketed GCIDE character
// code, or false if code is not one (then the whole span is dropped).
func gcideCode(code string) (string, bool) {
	if rep, ok := gcideNamed(code); ok {
		return rep, true
	}
	// A diacritic before (or ^ after) one or two letters: [`e], [=oo], [i^].
	letters := ""
	switch {
	case len(code) >= 2 && len(code) <= 3 && isMark(code[0]):
		letters = code[1:]
	case len(code) >= 2 && len(code) <= 3 && code[len(code)-1] == '^':
		letters = code[:len(code)-1]
	default:
		return "", false
	}
	for i := 0; i < len(letters); i++ {
		if !isLetter(letters[i]) {
			return "", false
		}
	}
	return letters, true
}

func isMark(c byte) bool   { return strings.IndexByte("`'^\"~=-.,*:", c) >= 0 }
func isUpper(c byte) bool  { return c >= 'A' && c <= 'Z' }
func isLetter(c byte) bool { return isUpper(c) || c >= 'a' && c <= 'z' }
func isDigit(c byte) bool  { return c >= '0' && c <= '9' }
