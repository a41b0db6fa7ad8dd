package netem_test

import (
	"github.com/skyhive/skyhive/netem"
	"github.com/skyhive/skyhive/p2p/memnet"
)

// A *netem.Network is a memnet link.
var _ memnet.Link = (*netem.Network)(nil)
