package optimizer

// StepInfo describes one finished local step, for progress reporting.
type StepInfo struct {
	Step  int // local steps done
	Round int // the round counter (WAGMA may jump it forward)
}

// Stats summarises an optimizer's averaging.
type Stats struct {
	Rank          int     `json:"rank"`
	Steps         int     `json:"steps"`
	Round         int     `json:"round"`
	Samples       int64   `json:"samples"`
	WaitSeconds   float64 `json:"wait_seconds"` // blocked in synchronous averaging
	GroupActive   int     `json:"group_active"` // group rounds this peer activated
	GroupPassive  int     `json:"group_passive"`
	GroupDeclined int     `json:"group_declined"`
	GlobalSyncs   int     `json:"global_syncs"`
	Groups        int     `json:"groups,omitempty"`        // MatchDHT groups averaged in
	GroupMembers  int     `json:"group_members,omitempty"` // their sizes summed
	Alone         int     `json:"alone,omitempty"`         // MatchDHT rounds without a partner
	MatchErrors   int     `json:"match_errors,omitempty"`  // MatchDHT rounds lost to DHT errors
	Mismatched    int     `json:"mismatched,omitempty"`    // declarations of peers with another model, ignored
	Failures      int     `json:"failures"`                // collectives with failed or missing members
	Dead          int     `json:"dead"`                    // peers given up on (MatchRanks)
	BytesSent     int64   `json:"bytes_sent"`
	BytesReceived int64   `json:"bytes_received"`
	StatesServed  int     `json:"states_served"`
	// Refused counts activations refused: from a peer outside the roster,
	// or naming a round outside RoundWindow.
	Refused int `json:"refused,omitempty"`
	// Rejected counts members whose contribution to this peer's part was
	// rejected by the averager (norm check or robust aggregation), summed
	// over collectives.
	Rejected int `json:"rejected,omitempty"`
	// OuterSteps counts DiLoCo outer steps applied (global and group);
	// their bytes are in BytesSent and BytesReceived.
	OuterSteps int `json:"outer_steps,omitempty"`
	// OuterDropped counts WA-DiLoCo group outer steps whose result came
	// after a global outer step had superseded it, and was dropped.
	OuterDropped int `json:"outer_dropped,omitempty"`
	// GroupDropped counts WAGMA group averages whose result came after a
	// synchronous global average had superseded it, and was dropped.
	GroupDropped int `json:"group_dropped,omitempty"`
	// Collectives counts the all-reduces this peer took part in (group and
	// global), and CollectiveSeconds sums their wall time.
	Collectives       int     `json:"collectives,omitempty"`
	CollectiveSeconds float64 `json:"collective_seconds,omitempty"`
	// QueueSeconds sums the time WA-DiLoCo's outer steps waited for this
	// peer's previous one to end before they could begin.
	QueueSeconds float64 `json:"queue_seconds,omitempty"`
	// MissingMembers, FailedMembers and Errors say why collectives failed:
	// members whose contribution did not arrive within ReduceWait, members
	// whose part could not be averaged, and collectives that returned an
	// error (summed over collectives).
	MissingMembers int `json:"missing_members,omitempty"`
	FailedMembers  int `json:"failed_members,omitempty"`
	Errors         int `json:"errors,omitempty"`
	// DeclinedBy counts members that declined collectives of this peer
	// (they were busy): not failures, and not given up on.
	DeclinedBy int `json:"declined_by,omitempty"`
	// Disagreed counts members that joined collectives of this peer with
	// another member list (one side had given up on a peer the other had
	// not): alive, so not failures; Revived counts the members given up
	// on that were taken back because of it (MatchRanks).
	Disagreed int `json:"disagreed,omitempty"`
	Revived   int `json:"revived,omitempty"`
}
