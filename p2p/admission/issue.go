package admission

import (
	"time"

	"github.com/libp2p/go-libp2p/core/peer"
)

// IssueMemberToken signs a member token for p, valid until expires, with
// the private swarm key in keyFile, and writes it to out.
func IssueMemberToken(keyFile string, p peer.ID, expires time.Time, out string) (*MemberToken, error) {
	k, err := ReadSwarmPrivateKey(keyFile)
	if err != nil {
		return nil, err
	}
	t, err := NewMemberToken(k, p, expires)
	if err != nil {
		return nil, err
	}
	if err := WriteMemberToken(out, t); err != nil {
		return nil, err
	}
	return t, nil
}
