package profile

import "errors"

// JoinDevices joins the device profiles at paths, in pipeline order, into
// a cluster profile whose unmeasured links are intra within a region and
// inter across regions; it checks that the allocator can use the result.
func JoinDevices(paths []string, intra, inter LinkSpec) (*ClusterProfile, error) {
	for _, l := range []LinkSpec{intra, inter} {
		if l.Latency < 0 || l.Bandwidth < 0 {
			return nil, errors.New("link latencies and bandwidths must not be negative")
		}
	}
	cp := &ClusterProfile{Format: ClusterFormat, Intra: intra, Inter: inter}
	for _, p := range paths {
		d, err := LoadDevice(p)
		if err != nil {
			return nil, err
		}
		cp.Devices = append(cp.Devices, d)
	}
	if _, err := cp.Alloc(); err != nil {
		return nil, err
	}
	return cp, nil
}
