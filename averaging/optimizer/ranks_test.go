package optimizer

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/skyhive/skyhive/averaging"
	"github.com/skyhive/skyhive/p2p"
)

// An algorithm without group rounds (local SGD) refuses a group activation
// from a member of its butterfly group, and starts nothing.
func TestGroupActivationNeedsAGroupAlgorithm(t *testing.T) {
	os, ps, _ := twoParamPeers(t, 4)
	o := os[0]
	ranks, _, err := averaging.ButterflyGroup(0, 4, o.cfg.GroupSize, 1)
	if err != nil {
		t.Fatal(err)
	}
	from := ps[ranks[len(ranks)-1]]
	if from.ID() == ps[0].ID() {
		from = ps[ranks[0]]
	}
	_, err = from.Call(context.Background(), ps[0].AddrInfo(), ActivateProtocol, activation{Kind: activateGroup, Round: 1}.marshal())
	var re *p2p.RemoteError
	if !errors.As(err, &re) || !strings.Contains(re.Msg, "no group rounds") {
		t.Fatalf("%v, want a refusal naming the missing group rounds", err)
	}
	if st := o.Stats(); st.GroupPassive != 0 || st.GroupDeclined != 0 || st.Refused != 0 {
		t.Fatalf("%+v", st)
	}
}
