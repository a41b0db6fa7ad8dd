package metrics

import (
	"context"
	"fmt"
	"io"
	"strconv"
	"text/tabwriter"
	"time"

	"github.com/skyhive/skyhive/p2p"
)

// StatusReport is the swarm's status records read at Time, with the number
// of records left out as invalid, forged or expired (skyhive status
// --json).
type StatusReport struct {
	Time    time.Time `json:"time"`
	Peers   []Status  `json:"peers"`
	Dropped int       `json:"dropped"`
	// Crowded says a DHT replica's answer for the status key was near
	// what one answer carries: the key holds very many records, perhaps a
	// peer's flood (answers are shared among writers, so live peers
	// still show).
	Crowded bool `json:"crowded,omitempty"`
}

// WriteTable prints the records as a table, each peer's last sighting
// relative to r.Time, and a line counting them.
func (r StatusReport) WriteTable(w io.Writer) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "PEER\tROLE\tREGION\tVERSION\tSTEP\tSAMPLES/S\tLOSS\tREACH\tLAST SEEN")
	for _, s := range r.Peers {
		loss := "-"
		if s.Loss != nil {
			loss = strconv.FormatFloat(*s.Loss, 'f', 4, 64)
		}
		seen := ago(r.Time.Sub(s.Time)) + " ago"
		if !s.Alive(r.Time) {
			seen += " (gone?)"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%.1f\t%s\t%s\t%s\n", p2p.ShortID(s.Peer), s.Role, orDash(s.Region), orDash(s.Version),
			s.Step, s.SamplesPerSecond, loss, orDash(s.Reach), seen)
	}
	tw.Flush()
	fmt.Fprintf(w, "%d peers", len(r.Peers))
	if r.Dropped > 0 {
		fmt.Fprintf(w, "; %d invalid, forged or expired records left out", r.Dropped)
	}
	fmt.Fprintln(w)
	if r.Crowded {
		fmt.Fprintln(w, "warning: the status key holds more records than one DHT answer carries (a peer may be flooding it); answers are shared among the records' writers, so every live peer should still show")
	}
}

// ago rounds a duration for people: 850ms, 12s, 3m4s, 2h5m.
func ago(d time.Duration) string {
	switch {
	case d < 0:
		return "0s"
	case d < time.Second:
		return d.Round(10 * time.Millisecond).String()
	case d < time.Hour:
		return d.Round(time.Second).String()
	}
	return d.Round(time.Minute).String()
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// ReadStatusReport reads the swarm's status records (ReadStatus) at now
// into a report; its Peers is empty, not nil, without records, as JSON
// shows them.
func ReadStatusReport(ctx context.Context, g Getter, now time.Time) (StatusReport, error) {
	peers, dropped, crowded, err := readStatus(ctx, g, now)
	if peers == nil {
		peers = []Status{}
	}
	return StatusReport{Time: now.UTC(), Peers: peers, Dropped: dropped, Crowded: crowded}, err
}
