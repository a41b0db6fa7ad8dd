package metrics

import (
	"context"
	"fmt"
	"io"
)

// Start serves a new registry on addr until ctx ends or stop is called,
// and says where on log (and any error closing it). With addr "" the
// registry is nil (its Registerer too: no component counts anything) and
// stop does nothing.
func Start(ctx context.Context, addr string, log io.Writer) (reg *Registry, stop func(), err error) {
	if addr == "" {
		return nil, func() {}, nil
	}
	reg = NewRegistry()
	srv, err := Serve(ctx, addr, reg)
	if err != nil {
		return nil, nil, err
	}
	fmt.Fprintf(log, "metrics on %s\n", srv.URL())
	return reg, func() {
		if err := srv.Close(); err != nil {
			fmt.Fprintf(log, "metrics: %v\n", err)
		}
	}, nil
}
