package dht

import (
	"context"
	"fmt"
	"io"
	"maps"
	"slices"
	"strconv"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/skyhive/skyhive/jsonl"
)

// WriteItems prints "VALUE<TAB>expires in D" for a plain value, or
// "SUBKEY<TAB>VALUE<TAB>expires in D" per subkey, sorted; values and
// subkeys that are not plain text are Go-quoted.
func WriteItems(w io.Writer, items map[string]Item) {
	for _, k := range slices.Sorted(maps.Keys(items)) {
		it := items[k]
		left := time.Until(it.Expiration).Round(time.Second)
		if k == "" {
			fmt.Fprintf(w, "%s\texpires in %v\n", printable(it.Value), left)
		} else {
			fmt.Fprintf(w, "%s\t%s\texpires in %v\n", printable([]byte(k)), printable(it.Value), left)
		}
	}
}

// printable returns b as is if it is plain text, else Go-quoted.
func printable(b []byte) string {
	s := string(b)
	if !utf8.ValidString(s) || len(s) == 0 {
		return strconv.Quote(s)
	}
	for _, r := range s {
		if !unicode.IsPrint(r) || r == '\t' {
			return strconv.Quote(s)
		}
	}
	return s
}

// WriteStats appends a JSON line to w every period until ctx ends: the
// time, the node's uptime since the call, its routing-table peers and
// stored records. It returns the first write error, once ctx ends; a nil
// w writes nothing.
func (n *Node) WriteStats(ctx context.Context, w io.Writer, every time.Duration) error {
	if w == nil {
		<-ctx.Done()
		return nil
	}
	t := time.NewTicker(every)
	defer t.Stop()
	lines := jsonl.Writer{W: w}
	start := time.Now()
	for {
		select {
		case <-ctx.Done():
			return lines.Err
		case now := <-t.C:
			lines.Write(map[string]any{"time": now.UTC().Format(time.RFC3339), "uptime_seconds": now.Sub(start).Seconds(),
				"peers": len(n.Peers()), "records": n.Records()})
		}
	}
}
