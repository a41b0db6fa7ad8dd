package hostile

import (
	"errors"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
)

// WriteStart prints what a run of c will do: how many peers it attacks,
// from how many identities, for how long and how fast.
func (c RunConfig) WriteStart(w io.Writer) {
	fmt.Fprintf(w, "attacking %d peers from %d identities for %s (%.0f requests/s", len(c.Targets), c.Identities, c.Duration, c.Rate)
	if c.SlowRate > 0 {
		fmt.Fprintf(w, ", %.1f slow senders/s; their verdicts take about 31 s more", c.SlowRate)
	}
	fmt.Fprintln(w, ")")
}

// WriteText prints the targets' roles and one line per attack: requests
// sent, refused, held, inapplicable and accepted; then the totals and the
// breaches.
func (r Report) WriteText(w io.Writer) {
	for _, t := range r.Targets {
		fmt.Fprintf(w, "target %s: %s", t.ID, strings.Join(t.Roles, ", "))
		if t.Note != "" {
			fmt.Fprintf(w, " (%s)", t.Note)
		}
		fmt.Fprintln(w)
	}
	fmt.Fprintf(w, "%-44s %8s %8s %6s %5s %8s\n", "attack", "sent", "refused", "held", "n/a", "accepted")
	for _, ft := range []FloodTally{r.Fast, r.Slow} {
		for _, n := range slices.Sorted(maps.Keys(ft.ByAttack)) {
			a := ft.ByAttack[n]
			acc := fmt.Sprint(a.Accepted)
			if a.Absorbed && a.Accepted > 0 {
				acc += " (absorbed)"
			}
			fmt.Fprintf(w, "%-44s %8d %8d %6d %5d %8s\n", n, a.Sent, a.Refused, a.Unanswered, a.Inapplicable, acc)
		}
	}
	fmt.Fprintf(w, "%d requests in %.0f s (%.0f/s)", r.Fast.Sent+r.Slow.Sent, r.Fast.Seconds, r.Fast.Rate)
	if len(r.Breaches) == 0 {
		fmt.Fprintln(w, "; every defence held")
	} else {
		fmt.Fprintf(w, "; BREACHES: %s\n", strings.Join(r.Breaches, ", "))
	}
}

// Err is nil if every defence held, else an error naming the breaches.
func (r Report) Err() error {
	if len(r.Breaches) == 0 {
		return nil
	}
	return errors.New("the victims accepted or held hostile requests: " + strings.Join(r.Breaches, ", "))
}
