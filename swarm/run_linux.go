package swarm

import (
	"context"

	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/skyhive/skyhive/netem"
)

func newNamespaces(ctx context.Context, n *netem.Network, ids, nat []peer.ID) (namespaces, error) {
	return netem.NewTopology(ctx, n, ids, netem.TopologyOptions{Prefix: "skyswarm", NAT: nat})
}
