package main

import (
	"bufio"
	"bytes"
	"context"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/skyhive/skyhive/data"
)

// metricsProc is a skyhive process started with --metrics 127.0.0.1:0.
type metricsProc struct {
	*proc
	url  string      // http://ADDR/metrics, from its "metrics on" line
	addr chan string // its /p2p/ addresses, as printed on stdout
}

// startWithMetrics starts `skyhive ARGS --metrics 127.0.0.1:0` and waits
// (up to 20 s) for the line saying where its metrics are.
func startWithMetrics(t *testing.T, args ...string) *metricsProc {
	t.Helper()
	outR, outW := io.Pipe()
	errR, errW := io.Pipe()
	p := startCLIWith(t, outW, errW, append(args, "--metrics", "127.0.0.1:0")...)
	t.Cleanup(func() { outW.Close(); errW.Close() })
	m := &metricsProc{proc: p, addr: make(chan string, 16)}
	url := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(errR)
		for sc.Scan() {
			if u, ok := strings.CutPrefix(sc.Text(), "metrics on "); ok {
				select {
				case url <- strings.TrimSpace(u):
				default:
				}
			}
		}
	}()
	go func() {
		sc := bufio.NewScanner(outR)
		for sc.Scan() {
			if l := strings.TrimSpace(sc.Text()); strings.HasPrefix(l, "/ip4/127.0.0.1/") && strings.Contains(l, "/p2p/") {
				select {
				case m.addr <- l:
				default:
				}
			}
		}
	}()
	select {
	case m.url = <-url:
	case <-p.done:
		t.Fatalf("%v exited: %v\n%s", args, p.err, tail(p.stderr.String()))
	case <-time.After(20 * time.Second):
		t.Fatalf("%v printed no metrics address; stderr:\n%s", args, tail(p.stderr.String()))
	}
	return m
}

// scrapeMetrics fetches url and parses the body in the Prometheus text
// format; it returns the families and the body.
func scrapeMetrics(ctx context.Context, url string) (map[string]*dto.MetricFamily, []byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
	if err != nil {
		return nil, nil, err
	}
	if resp.StatusCode != http.StatusOK {
		return nil, body, &httpError{resp.Status}
	}
	p := expfmt.NewTextParser(model.LegacyValidation)
	fams, err := p.TextToMetricFamilies(bytes.NewReader(body))
	return fams, body, err
}

type httpError struct{ status string }

func (e *httpError) Error() string { return "HTTP " + e.status }

// TestMetricsOfLongRunningCommands scrapes /metrics of a real `skyhive
// dht`, `skyhive server` and `skyhive peer` on loopback: each parses in
// the Prometheus text format, has its component's families and the Go and
// process collectors', and passes `promtool check metrics` (Debian's
// prometheus package, installed by scripts/setup.sh) when promtool is
// installed.
func TestMetricsOfLongRunningCommands(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 45*time.Second)
	defer cancel()
	dht := startWithMetrics(t, "dht", "--listen", "/ip4/127.0.0.1/tcp/0")
	var dhtAddr string
	select {
	case dhtAddr = <-dht.addr:
	case <-ctx.Done():
		t.Fatalf("dht printed no address:\n%s", tail(dht.stderr.String()))
	}
	srv := startWithMetrics(t, "server", "--experts", "ffn.[0:2].[0:2]", "--hidden", "16", "--dht", dhtAddr,
		"--listen", "/ip4/127.0.0.1/tcp/0", "--declare-every", "2s", "--stats-every", "0")
	runtime := []string{"go_goroutines", "go_memstats_alloc_bytes", "go_build_info", "process_cpu_seconds_total",
		"process_resident_memory_bytes", "skyhive_p2p_connections", "skyhive_p2p_peers"}
	cases := []struct {
		name string
		p    *metricsProc
		want []string
	}{
		{"dht", dht, []string{"skyhive_dht_records", "skyhive_dht_routing_table_peers", "skyhive_dht_lookups_total",
			"skyhive_dht_requests_total", "skyhive_dht_stores_refused_total", "skyhive_dht_stores_accepted_total",
			"skyhive_p2p_sent_bytes_total", "skyhive_p2p_rpc_duration_seconds"}},
		{"server", srv, []string{"skyhive_expert_requests_total", "skyhive_expert_request_errors_total",
			"skyhive_expert_batch_rows", "skyhive_expert_request_duration_seconds", "skyhive_expert_queue_requests",
			"skyhive_expert_skipped_steps_total", "skyhive_expert_experts", "skyhive_dht_records", "skyhive_dht_lookups_total"}},
	}
	if fashionMNISTInstalled() {
		peer := startWithMetrics(t, "peer", "--dht", dhtAddr, "--listen", "/ip4/127.0.0.1/tcp/0", "--min-peers", "1",
			"--model", "mlp-small", "--limit", "512", "--eval-examples", "100", "--batch", "32", "--round-interval", "1s",
			"--duration", "2m", "--quiet", "--run-id", "metrics-test")
		cases = append(cases, struct {
			name string
			p    *metricsProc
			want []string
		}{"peer", peer, []string{"skyhive_averaging_rounds_total", "skyhive_averaging_round", "skyhive_averaging_group_size",
			"skyhive_averaging_staleness_rounds", "skyhive_averaging_sent_bytes_total", "skyhive_averaging_stragglers_dropped_total",
			"skyhive_averaging_steps_total", "skyhive_train_steps_total", "skyhive_train_samples_total", "skyhive_train_loss",
			"skyhive_dht_records"}})
	} else {
		t.Log("Fashion-MNIST not installed (scripts/setup.sh): no averaging peer")
	}
	promtool, _ := exec.LookPath("promtool")
	if promtool == "" {
		t.Log("promtool not installed (Debian's prometheus, scripts/setup.sh): skipping promtool check metrics")
	}
	for _, c := range cases {
		want := append(slices.Clone(c.want), runtime...)
		var fams map[string]*dto.MetricFamily
		var body []byte
		var missing []string
		// The peer's averaging and training collectors appear once it
		// has joined the swarm and stepped: scrape until every family is
		// there.
		for {
			var err error
			sctx, scancel := context.WithTimeout(ctx, 10*time.Second)
			fams, body, err = scrapeMetrics(sctx, c.p.url)
			scancel()
			if err != nil {
				t.Fatalf("%s: scrape %s: %v\n%s", c.name, c.p.url, err, body)
			}
			missing = missing[:0]
			for _, name := range want {
				if fams[name] == nil {
					missing = append(missing, name)
				}
			}
			if len(missing) == 0 || ctx.Err() != nil {
				break
			}
			select {
			case <-ctx.Done():
			case <-c.p.done:
				t.Fatalf("%s exited: %v\n%s", c.name, c.p.err, tail(c.p.stderr.String()))
			case <-time.After(200 * time.Millisecond):
			}
		}
		if len(missing) > 0 {
			t.Errorf("%s: no %v among %d families; stderr:\n%s", c.name, missing, len(fams), tail(c.p.stderr.String()))
			continue
		}
		for name, f := range fams {
			if !strings.HasPrefix(name, "skyhive_") {
				continue
			}
			if f.GetHelp() == "" {
				t.Errorf("%s: %s has no help", c.name, name)
			}
			if f.GetType() == dto.MetricType_COUNTER && !strings.HasSuffix(name, "_total") {
				t.Errorf("%s: counter %s does not end in _total", c.name, name)
			}
		}
		if promtool != "" {
			pctx, pcancel := context.WithTimeout(ctx, 20*time.Second)
			cmd := exec.CommandContext(pctx, promtool, "check", "metrics")
			cmd.Stdin = bytes.NewReader(body)
			out, err := cmd.CombinedOutput()
			pcancel()
			if err != nil {
				t.Errorf("%s: promtool check metrics: %v\n%s", c.name, err, out)
			}
		}
	}
}

// fashionMNISTInstalled reports whether the peer's data is there.
func fashionMNISTInstalled() bool {
	_, err := os.Stat(filepath.Join(data.DefaultDir, "t10k-labels-idx1-ubyte.gz"))
	return err == nil
}
