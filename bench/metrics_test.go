package bench

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/skyhive/skyhive/metrics"
)

// Components of one suite register the same names through
// Options.registerer without colliding, and unregister what they
// registered: when they share the registerer, when they use their own,
// and when they wrap it (a new wrapper at every call).
func TestInstanceRegisterer(t *testing.T) {
	reg := metrics.NewRegistry()
	if (Options{}).registerer() != nil {
		t.Fatal("metrics off must give a nil registerer")
	}
	o := Options{Metrics: reg.Registerer()}
	r := o.registerer()
	counter := func() prometheus.Counter {
		return prometheus.NewCounter(prometheus.CounterOpts{Name: "skyhive_test_total", Help: "test"})
	}
	// values are the series' values, sorted (a registry wants one set of
	// label names per metric name: ranked ones are named apart).
	values := func() []float64 {
		mfs, err := reg.Gatherer().Gather()
		if err != nil {
			t.Fatal(err)
		}
		var vs []float64
		for _, mf := range mfs {
			if !strings.HasPrefix(mf.GetName(), "skyhive_test_") {
				continue
			}
			for _, m := range mf.GetMetric() {
				if !slices.ContainsFunc(m.GetLabel(), func(l *dto.LabelPair) bool { return l.GetName() == InstanceLabel }) {
					t.Errorf("labels %v", m.GetLabel())
				}
				vs = append(vs, m.GetCounter().GetValue())
			}
		}
		slices.Sort(vs)
		return vs
	}
	a, b, c := counter(), counter(), counter()
	a.Add(1)
	b.Add(2)
	c.Add(3)
	for _, x := range []prometheus.Collector{a, b} { // a template's registerer
		if err := r.Register(x); err != nil {
			t.Fatal(err)
		}
	}
	other := o.registerer()
	if err := other.Register(c); err != nil {
		t.Fatalf("another component: %v", err)
	}
	rank := func(i string) prometheus.Registerer {
		return prometheus.WrapRegistererWith(prometheus.Labels{"rank": i}, r)
	}
	ranked := func() prometheus.Counter {
		return prometheus.NewCounter(prometheus.CounterOpts{Name: "skyhive_test_ranked_total", Help: "test"})
	}
	d, e := ranked(), ranked()
	d.Add(4)
	e.Add(5)
	if err := rank("0").Register(d); err != nil {
		t.Fatal(err)
	}
	if err := rank("1").Register(e); err != nil {
		t.Fatal(err)
	}
	if got := values(); !slices.Equal(got, []float64{1, 2, 3, 4, 5}) {
		t.Fatalf("series %v", got)
	}
	if !r.Unregister(b) || !rank("0").Unregister(d) {
		t.Fatal("unregister failed")
	}
	if got := values(); !slices.Equal(got, []float64{1, 3, 5}) {
		t.Fatalf("series after unregistering b and d: %v", got)
	}
	if !other.Unregister(c) || other.Unregister(c) {
		t.Fatal("unregister of c failed, or succeeded twice")
	}
	if got := values(); !slices.Equal(got, []float64{1, 5}) {
		t.Fatalf("series after unregistering c: %v", got)
	}
}

func TestScraper(t *testing.T) {
	reg := metrics.NewRegistry()
	sc, err := StartScraper("127.0.0.1:0", reg, 20*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(200 * time.Millisecond)
	st := sc.Stop()
	if st.Scrapes < 2 || st.Failures > 0 || st.Series < 10 || st.Bytes == 0 || st.Max < st.Mean {
		t.Fatalf("stats %+v", st)
	}
	t.Log(st)
}
