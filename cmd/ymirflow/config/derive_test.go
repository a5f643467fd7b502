package config

import (
	"flag"
	"os"
	"strings"
	"testing"
	"time"
)

// A lease setting given alone is never refused for a relation with a default: the
// settings it is related to follow it.
func TestDerivedLeaseSettings(t *testing.T) {
	// Not parallel: it sets the process environment (clearEnv, t.Setenv), which is one per process: Go refuses t.Setenv in a parallel test.
	type lease struct{ ttl, grace, idle, hold time.Duration }
	for _, tc := range []struct {
		env  map[string]string
		want lease
	}{
		{nil, lease{300 * time.Second, 10 * time.Second, 3 * time.Minute, 6 * time.Hour}},
		{map[string]string{"LOCK_TTL": "10s"}, lease{10 * time.Second, time.Second, 3 * time.Minute, 6 * time.Hour}},
		{map[string]string{"LOCK_TTL": "10m"}, lease{10 * time.Minute, 10 * time.Second, 5 * time.Minute, 6 * time.Hour}},
		{map[string]string{"LOCK_TTL": "24h"}, lease{24 * time.Hour, 10 * time.Second, 12 * time.Hour, 24 * time.Hour}},
		{map[string]string{"KILL_GRACE": "1m"}, lease{10 * time.Minute, time.Minute, 5 * time.Minute, 6 * time.Hour}},
		{map[string]string{"MAX_IDLE_TIME": "30s"}, lease{time.Minute, 6 * time.Second, 30 * time.Second, 6 * time.Hour}},
		{map[string]string{"LOCK_MAX_HOLD": "1s"}, lease{time.Second, 100 * time.Millisecond, 3 * time.Minute, time.Second}},
		{map[string]string{"LOCK_TTL": "1m", "KILL_GRACE": "2s"}, lease{time.Minute, 2 * time.Second, 3 * time.Minute, 6 * time.Hour}},
	} {
		clearEnv(t)
		for k, v := range tc.env {
			t.Setenv(k, v)
		}
		var w Worker
		if err := load(t, "worker", &w, demoWorker()...); err != nil {
			t.Errorf("%v: %v", tc.env, err)
			continue
		}
		if got := (lease{w.LockTTL, w.KillGrace, w.MaxIdleTime, w.LockMaxHold}); got != tc.want {
			t.Errorf("%v: LOCK_TTL, KILL_GRACE, MAX_IDLE_TIME, LOCK_MAX_HOLD = %v, want %v", tc.env, got, tc.want)
		}
	}
}

// Each duration setting of the worker and the fetcher, set alone to either end of its
// documented range, is accepted, and --help documents the range.
func TestDurationRangeEndsAloneAreValid(t *testing.T) {
	// Not parallel: it sets the process environment (clearEnv, t.Setenv), which is one per process: Go refuses t.Setenv in a parallel test.
	for _, name := range []string{"worker", "fetch"} {
		cmd := Commands()[name]
		fs := flag.NewFlagSet(name, flag.ContinueOnError)
		cmd.Register(fs)
		var help strings.Builder
		WriteUsage(&help, fs)
		fs.VisitAll(func(f *flag.Flag) {
			if _, ok := f.Value.(flag.Getter).Get().(time.Duration); !ok {
				return
			}
			r, ok := DurationRanges[f.Name]
			if !ok {
				t.Errorf("%s --%s: a duration setting without a documented range", name, f.Name)
				return
			}
			if !strings.Contains(help.String(), "from "+fmtDur(r.Min)+" to "+fmtDur(r.Max)) {
				t.Errorf("%s --help does not document the range of --%s", name, f.Name)
			}
			base := map[string][]string{"worker": demoWorker(), "fetch": {"--jira-url", "http://j"}}[name]
			for _, v := range []time.Duration{r.Min, r.Max} {
				clearEnv(t)
				t.Setenv(EnvName(f), v.String())
				if err := load(t, name, Commands()[name], base...); err != nil {
					t.Errorf("%s %s=%s alone: %v", name, EnvName(f), v, err)
				}
			}
		})
	}
}

// An environment variable set to the empty string means what --help says the empty
// value means, like --flag ” does.
func TestEmptyEnvMeansWhatHelpSays(t *testing.T) {
	// Not parallel: it sets the process environment (clearEnv, t.Setenv), which is one per process: Go refuses t.Setenv in a parallel test.
	clearEnv(t)
	t.Setenv("JIRA_TRIGGER_GROUP", "")
	t.Setenv("METRICS_ADDR", "")
	var w Worker
	if err := load(t, "worker", &w, demoWorker()...); err != nil {
		t.Fatal(err)
	}
	if w.JiraTriggerGroup != "" || w.MetricsAddr != "" {
		t.Fatalf("JIRA_TRIGGER_GROUP= and METRICS_ADDR=: got %q and %q, want empty (anyone, off)", w.JiraTriggerGroup, w.MetricsAddr)
	}
	// Every setting whose --help gives the empty value a meaning, in every command.
	n := 0
	for name, cmd := range Commands() {
		fs := flag.NewFlagSet(name, flag.ContinueOnError)
		cmd.Register(fs)
		fs.VisitAll(func(f *flag.Flag) {
			if !EmptyMeaningful(f) {
				return
			}
			n++
			clearEnv(t)
			t.Setenv(EnvName(f), "")
			fs2 := flag.NewFlagSet(name, flag.ContinueOnError)
			Commands()[name].Register(fs2)
			if err := Parse(fs2, nil); err != nil {
				t.Fatalf("%s %s=: %v", name, EnvName(f), err)
			}
			if v := fs2.Lookup(f.Name).Value.String(); v != "" {
				t.Errorf("%s %s= gives %q, want the empty value --help describes", name, EnvName(f), v)
			}
		})
	}
	if n < 5 {
		t.Fatalf("only %d settings give the empty value a meaning", n)
	}
	// Elsewhere an empty variable still counts as unset.
	clearEnv(t)
	t.Setenv("LOCK_TTL", "")
	if err := os.Setenv("LOG_LEVEL", ""); err != nil {
		t.Fatal(err)
	}
	var w2 Worker
	if err := load(t, "worker", &w2, demoWorker()...); err != nil || w2.LockTTL != DefaultLockTTL || w2.LogLevel != DefaultLogLevel {
		t.Fatalf("LOCK_TTL= LOG_LEVEL=: %v, %v %q", err, w2.LockTTL, w2.LogLevel)
	}
}
