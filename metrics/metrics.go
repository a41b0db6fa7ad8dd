// Package metrics is what a swarm shows of itself: the process's
// Prometheus metrics, and the status record every peer publishes in the
// DHT (status*.go).
//
// For the metrics it holds a registry per process (no global state) with
// the Go runtime and process collectors, to which the components register
// their own collectors, and the HTTP endpoint that serves it on /metrics
// (`--metrics ADDR` of every long-running command).
//
// The components (p2p, dht, moe/server, averaging/optimizer, pipeline,
// train, ...) take a prometheus.Registerer in their Config (nil: no
// metrics and no cost), not a *Registry, since this package builds on p2p
// and dht for the status records; each registers one collector, which
// reads the counters it keeps anyway when Prometheus scrapes; on hot
// paths they add at most atomic counter adds and histogram observations
// of latencies they measure. Training loops report through Training.
// Every name follows the Prometheus conventions: the skyhive_ prefix, base
// units (seconds, bytes), _total for counters; docs/observability.md lists
// them.
package metrics

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// Namespace prefixes every Skyhive metric name.
const Namespace = "skyhive"

// Registry is one process's Prometheus registry. A nil *Registry stands for
// "metrics off": Registerer returns nil, which components take as no
// metrics.
type Registry struct {
	reg *prometheus.Registry
}

// NewRegistry returns a registry holding the Go runtime collector (go_*),
// the process collector (process_*) and go_build_info.
func NewRegistry() *Registry {
	reg := prometheus.NewRegistry()
	reg.MustRegister(
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		collectors.NewBuildInfoCollector(),
	)
	return &Registry{reg: reg}
}

// Registerer is what components register their collectors with; it is
// nil (an untyped nil interface, so that `cfg.Metrics != nil` means
// metrics on) for a nil r.
func (r *Registry) Registerer() prometheus.Registerer {
	if r == nil {
		return nil
	}
	return r.reg
}

// Gatherer gathers the registered metrics (nil for a nil r).
func (r *Registry) Gatherer() prometheus.Gatherer {
	if r == nil {
		return nil
	}
	return r.reg
}

// Handler serves the registry in the Prometheus exposition formats; errors
// of single collectors are reported in the response, not fatal.
func (r *Registry) Handler() http.Handler {
	return promhttp.HandlerFor(r.reg, promhttp.HandlerOpts{
		ErrorHandling: promhttp.ContinueOnError,
		Registry:      r.reg, // promhttp_metric_handler_errors_total
		Timeout:       10 * time.Second,
	})
}

// Server serves a registry over HTTP: /metrics, and a short index on /.
type Server struct {
	addr   net.Addr
	srv    *http.Server
	cancel context.CancelFunc
	done   chan struct{}
	err    error // set before done is closed
}

// Serve listens on addr (host:port; port 0 picks a free one) and serves r
// on /metrics until ctx ends or Close is called. It returns once the
// listener is bound, so Addr is known; a failed bind is returned.
func Serve(ctx context.Context, addr string, r *Registry) (*Server, error) {
	if r == nil {
		return nil, errors.New("metrics: serve: nil registry")
	}
	ln, err := (&net.ListenConfig{}).Listen(ctx, "tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("metrics: listen on %q: %w", addr, err)
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", r.Handler())
	mux.HandleFunc("/", func(w http.ResponseWriter, req *http.Request) {
		if req.URL.Path != "/" {
			http.NotFound(w, req)
			return
		}
		fmt.Fprintln(w, "skyhive: Prometheus metrics on /metrics")
	})
	ctx, cancel := context.WithCancel(ctx)
	s := &Server{
		addr:   ln.Addr(),
		cancel: cancel,
		done:   make(chan struct{}),
		srv: &http.Server{
			Handler:           mux,
			ReadHeaderTimeout: 10 * time.Second,
			ReadTimeout:       30 * time.Second,
			WriteTimeout:      30 * time.Second,
			IdleTimeout:       2 * time.Minute,
			MaxHeaderBytes:    64 << 10,
		},
	}
	var wg sync.WaitGroup
	var serveErr error
	wg.Go(func() {
		if err := s.srv.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
			serveErr = err
			cancel()
		}
	})
	go func() {
		<-ctx.Done()
		sctx, stop := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
		err := s.srv.Shutdown(sctx)
		stop()
		if err != nil {
			s.srv.Close() // scrapes still running after the grace period
		}
		wg.Wait()
		if serveErr != nil {
			s.err = fmt.Errorf("metrics: serve: %w", serveErr)
		}
		close(s.done)
	}()
	return s, nil
}

// Addr is the address the server listens on.
func (s *Server) Addr() net.Addr { return s.addr }

// URL is where the metrics are: http://ADDR/metrics.
func (s *Server) URL() string { return "http://" + s.addr.String() + "/metrics" }

// Done is closed once the server has stopped (ctx ended, Close, or a
// failure of the listener).
func (s *Server) Done() <-chan struct{} { return s.done }

// Close stops the server, lets running scrapes finish (for up to two
// seconds) and waits for it; it returns the error that stopped it early,
// if any.
func (s *Server) Close() error {
	s.cancel()
	<-s.done
	return s.err
}
