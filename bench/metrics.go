package bench

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/skyhive/skyhive/metrics"
)

// InstanceLabel is the label that tells apart the components of a suite
// registered with Options.Metrics: every registration gets its own value,
// since a suite builds many hosts, nodes, servers or optimizers in one
// process and each registers the same metric names.
const InstanceLabel = "bench_instance"

// instances numbers registrations across the process.
var instances atomic.Uint64

// registerer is what a suite passes as the Metrics of the components it
// builds: nil when metrics are off, else o.Metrics with a distinct
// InstanceLabel on every collector registered through it (a template
// configuration shared by many components may carry it).
func (o Options) registerer() prometheus.Registerer {
	if o.Metrics == nil {
		return nil
	}
	return &instanceRegisterer{base: o.Metrics, wrapped: map[string][]registration{}}
}

// instanceRegisterer registers each collector under a label value of its
// own and unregisters it under the same one. It finds a collector's
// registration by its descriptors, as a prometheus.Registry does (a
// component that wraps its registerer hands Unregister a new wrapper of
// the same collector), and among registrations of equal descriptors (a
// template configuration shared by several components) by identity.
// Unchecked collectors (no descriptors) register but never unregister.
type instanceRegisterer struct {
	base    prometheus.Registerer
	mu      sync.Mutex
	wrapped map[string][]registration // by collectorKey
}

// registration is a collector and the labelled registerer it went to.
type registration struct {
	c prometheus.Collector
	w prometheus.Registerer
}

// same reports whether a and b are the same collector (false for
// collectors of types that cannot be compared).
func same(a, b prometheus.Collector) bool {
	ta, tb := reflect.TypeOf(a), reflect.TypeOf(b)
	return ta == tb && ta.Comparable() && a == b
}

// collectorKey is c's descriptors, sorted and joined ("" for none).
func collectorKey(c prometheus.Collector) string {
	ch := make(chan *prometheus.Desc, 16)
	go func() {
		c.Describe(ch)
		close(ch)
	}()
	var descs []string
	for d := range ch {
		descs = append(descs, d.String())
	}
	slices.Sort(descs)
	return strings.Join(descs, "\n")
}

func (r *instanceRegisterer) Register(c prometheus.Collector) error {
	w := prometheus.WrapRegistererWith(prometheus.Labels{InstanceLabel: strconv.FormatUint(instances.Add(1), 10)}, r.base)
	if err := w.Register(c); err != nil {
		return err
	}
	if key := collectorKey(c); key != "" {
		r.mu.Lock()
		r.wrapped[key] = append(r.wrapped[key], registration{c, w})
		r.mu.Unlock()
	}
	return nil
}

func (r *instanceRegisterer) MustRegister(cs ...prometheus.Collector) {
	for _, c := range cs {
		if err := r.Register(c); err != nil {
			panic(err)
		}
	}
}

func (r *instanceRegisterer) Unregister(c prometheus.Collector) bool {
	key := collectorKey(c)
	r.mu.Lock()
	regs := r.wrapped[key]
	if len(regs) == 0 {
		r.mu.Unlock()
		return false
	}
	// The collector itself, else (a new wrapper of it) the oldest of its
	// descriptors.
	i := max(slices.IndexFunc(regs, func(g registration) bool { return same(g.c, c) }), 0)
	w := regs[i].w
	if regs = slices.Delete(regs, i, i+1); len(regs) == 0 {
		delete(r.wrapped, key)
	} else {
		r.wrapped[key] = regs
	}
	r.mu.Unlock()
	return w.Unregister(c)
}

// ScrapeStats sums up the scrapes of a Scraper.
type ScrapeStats struct {
	Scrapes, Failures int
	// Series is the number of samples in the last scrape, Bytes its size.
	Series, Bytes int
	// Mean and Max are the durations of the scrapes (request to the body's
	// last byte).
	Mean, Max time.Duration
	// FirstErr is the first failure, if any.
	FirstErr error
}

func (s ScrapeStats) String() string {
	str := fmt.Sprintf("%d scrapes, last %d series (%.1f KiB), mean %.1f ms, max %.1f ms",
		s.Scrapes, s.Series, float64(s.Bytes)/1024, s.Mean.Seconds()*1e3, s.Max.Seconds()*1e3)
	if s.Failures > 0 {
		str += fmt.Sprintf(", %d failed (%v)", s.Failures, s.FirstErr)
	}
	return str
}

// Scraper serves a registry over HTTP and scrapes it periodically, as
// Prometheus would, so that a suite run with metrics pays their whole
// cost: the counting on hot paths, the collectors' reads at scrape time
// and the encoding.
type Scraper struct {
	srv    *metrics.Server
	client *http.Client
	cancel context.CancelFunc
	done   chan struct{}
	stats  ScrapeStats
}

// StartScraper serves reg on addr (host:port, port 0 for a free one) with
// metrics.Serve and scrapes it every period (a second if 0) until Stop.
func StartScraper(addr string, reg *metrics.Registry, every time.Duration) (*Scraper, error) {
	if every <= 0 {
		every = time.Second
	}
	ctx, cancel := context.WithCancel(context.Background())
	srv, err := metrics.Serve(ctx, addr, reg)
	if err != nil {
		cancel()
		return nil, err
	}
	s := &Scraper{
		srv:    srv,
		client: &http.Client{Transport: &http.Transport{}, Timeout: 10 * time.Second},
		cancel: cancel,
		done:   make(chan struct{}),
	}
	go s.loop(ctx, every)
	return s, nil
}

// URL is where the metrics are served.
func (s *Scraper) URL() string { return s.srv.URL() }

func (s *Scraper) loop(ctx context.Context, every time.Duration) {
	defer close(s.done)
	tick := time.NewTicker(every)
	defer tick.Stop()
	var total time.Duration
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		t0 := time.Now()
		body, err := s.scrape(ctx)
		d := time.Since(t0)
		if ctx.Err() != nil {
			return
		}
		if err != nil {
			s.stats.Failures++
			if s.stats.FirstErr == nil {
				s.stats.FirstErr = err
			}
			continue
		}
		s.stats.Scrapes++
		total += d
		s.stats.Mean = total / time.Duration(s.stats.Scrapes)
		s.stats.Max = max(s.stats.Max, d)
		s.stats.Bytes = len(body)
		s.stats.Series = countSamples(body)
	}
}

// countSamples counts the sample lines of a body in the text format.
func countSamples(body []byte) int {
	n := 0
	for line := range bytes.Lines(body) {
		if line[0] != '#' && line[0] != '\n' {
			n++
		}
	}
	return n
}

func (s *Scraper) scrape(ctx context.Context) ([]byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, s.srv.URL(), nil)
	if err != nil {
		return nil, err
	}
	resp, err := s.client.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("scrape: HTTP %s", resp.Status)
	}
	return body, nil
}

// Stop ends the scrapes, stops the server and returns what the scrapes
// saw.
func (s *Scraper) Stop() ScrapeStats {
	s.cancel()
	<-s.done
	s.client.CloseIdleConnections()
	if err := s.srv.Close(); err != nil && s.stats.FirstErr == nil {
		s.stats.FirstErr = err
	}
	return s.stats
}

// RunWithMetrics runs s with a fresh metrics registry in o.Metrics, served
// on addr and scraped every second while the suite runs; it logs where
// the metrics are and, at the end, what the scrapes saw.
func RunWithMetrics(ctx context.Context, s Suite, o Options, addr string) ([]Result, error) {
	reg := metrics.NewRegistry()
	sc, err := StartScraper(addr, reg, time.Second)
	if err != nil {
		return nil, err
	}
	o.Logf("bench %s: metrics on %s, scraped every second", s.Name, sc.URL())
	o.Metrics = reg.Registerer()
	rs, err := s.Run(ctx, o)
	st := sc.Stop()
	o.Logf("bench %s: metrics: %s", s.Name, st)
	return rs, err
}
