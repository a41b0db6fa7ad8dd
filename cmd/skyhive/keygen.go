package main

import (
	"fmt"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/spf13/cobra"

	"github.com/skyhive/skyhive/p2p"
	"github.com/skyhive/skyhive/p2p/admission"
)

// newKeygenCmd makes the keys that close a swarm to strangers and the
// identities of its peers.
func newKeygenCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "keygen",
		Short: "Create swarm secrets, swarm keys, member tokens and peer identities",
		Long: `Create the files that close a swarm to strangers (see docs/security.md).

Two ways to close a swarm:
  - a shared secret: every peer gets the same file with --swarm-secret FILE;
  - a swarm key: its owner signs a member token for each peer ID; every peer
    gets --swarm-key SWARM.pub and its own --member-token FILE. Tokens expire
    (--valid), and a leaked token is useless to another peer ID.`,
		Example: `  skyhive keygen secret swarm.secret
  skyhive keygen swarm swarm.key                   # writes swarm.key and swarm.key.pub
  skyhive keygen identity node1.key                # prints node1's peer ID
  skyhive keygen token --swarm-private-key swarm.key --peer 12D3KooW... node1.token
  skyhive server --swarm-key swarm.key.pub --member-token node1.token --identity node1.key ...`,
	}
	cmd.AddCommand(&cobra.Command{
		Use:   "secret FILE",
		Short: "Write a new random swarm secret (mode 0600) for --swarm-secret",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := admission.NewSwarmSecret(args[0]); err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "swarm secret written to %s: give it to every peer of the swarm (--swarm-secret %s)\n", args[0], args[0])
			return nil
		},
	})
	cmd.AddCommand(&cobra.Command{
		Use:   "swarm FILE",
		Short: "Write a new swarm key pair: FILE (private, signs tokens) and FILE.pub (for --swarm-key)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if _, err := admission.NewSwarmKey(args[0]); err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "swarm key written to %s (keep it private) and %s.pub (give it to every peer: --swarm-key %s.pub)\n", args[0], args[0], args[0])
			return nil
		},
	})
	cmd.AddCommand(&cobra.Command{
		Use:   "identity FILE",
		Short: "Create a peer identity (private key, mode 0600) if missing, and print its peer ID",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			k, err := p2p.LoadOrCreateIdentity(args[0])
			if err != nil {
				return err
			}
			id, err := peer.IDFromPrivateKey(k)
			if err != nil {
				return err
			}
			fmt.Fprintln(cmd.OutOrStdout(), id)
			return nil
		},
	})
	var swarmKey, peerID string
	var valid time.Duration
	token := &cobra.Command{
		Use:   "token FILE",
		Short: "Sign a member token for a peer ID with the swarm key, for --member-token",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if swarmKey == "" || peerID == "" {
				return fmt.Errorf("--swarm-private-key (the private swarm key file) and --peer (skyhive keygen identity prints it) are required")
			}
			id, err := peer.Decode(peerID)
			if err != nil {
				return fmt.Errorf("--peer %q: %w", peerID, err)
			}
			t, err := admission.IssueMemberToken(swarmKey, id, time.Now().Add(valid), args[0])
			if err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "member token for %s, valid until %s, written to %s\n", id, t.Expires.UTC().Format(time.RFC3339), args[0])
			return nil
		},
	}
	token.Flags().StringVar(&swarmKey, "swarm-private-key", "", "the private swarm key file (skyhive keygen swarm)")
	token.Flags().StringVar(&peerID, "peer", "", "the member's peer ID")
	token.Flags().DurationVar(&valid, "valid", 30*24*time.Hour, "how long the token is valid")
	token.PreRunE = checkedNumbers(numberRules{Positive: []string{"valid"}})
	cmd.AddCommand(token)
	return cmd
}
