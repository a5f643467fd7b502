package lockmw

import (
	"strings"
	"testing"
	"time"
)

func TestParsePolicies(t *testing.T) {
	t.Parallel()
	good := map[string]string{
		"":         "drop",
		"drop":     "drop",
		"coalesce": "coalesce",
		"delay:2m": "delay:2m0s",
		"triage.requested=drop,rebase.requested=coalesce,*=delay:2m": "rebase.requested=coalesce,triage.requested=drop,*=delay:2m0s",
		"rebase.requested=delay:1s:10s":                              "rebase.requested=delay:1s:10s,*=drop",
		" coalesce , backport.requested = drop ":                     "backport.requested=drop,*=coalesce",
		"rebase.requested=supersede,*=delay:1s":                      "rebase.requested=supersede,*=delay:1s",
		"supersede":                                                  "supersede",
		"wait":                                                       "wait",
		"wait:100":                                                   "wait",
		"rebase.requested=wait:5,*=delay:1s":                         "rebase.requested=wait:5,*=delay:1s",
	}
	for in, want := range good {
		p, err := ParsePolicies(in)
		if err != nil {
			t.Errorf("ParsePolicies(%q): %v", in, err)
			continue
		}
		if p.String() != want {
			t.Errorf("ParsePolicies(%q) = %s, want %s", in, p, want)
		}
		if back, err := ParsePolicies(p.String()); err != nil || back.String() != want {
			t.Errorf("%s does not read back: %v %v", p, back, err)
		}
	}
	p, _ := ParsePolicies("triage.requested=drop,rebase.requested=coalesce,*=delay:2m")
	if p.For("triage.requested").Policy != Drop || p.For("rebase.requested").Policy != Coalesce ||
		p.For("backport.requested") != (Rule{Policy: Delay, Delay: 2 * time.Minute, MaxDelay: 16 * time.Minute}) {
		t.Errorf("For: %+v", p)
	}
	bad := map[string]string{
		"queue":                                 `policy must be "drop", "coalesce", "deliver", "supersede" or "wait", got "queue"`,
		"wait:0":                                "wait MAX \"0\" must be a whole number from 1",
		"wait:x":                                "wait MAX \"x\"",
		"wait:100001":                           "wait MAX \"100001\"",
		"delay":                                 "delay needs a duration",
		"delay:":                                "delay needs a duration",
		"delay:x":                               `delay "x"`,
		"delay:1ms":                             "must be from 10ms",
		"delay:25h":                             "must be from 10ms",
		"delay:1m:30s":                          "delay cap 30s must be from the delay 1m0s",
		"drop,coalesce":                         "a second default",
		"a.requested=drop,a.requested=delay:1s": "a.requested given twice",
		"Rebase.requested=drop":                 "is not an event type",
		"rebase.requested=":                     "no rule after '='",
	}
	for in, want := range bad {
		_, err := ParsePolicies(in)
		if err == nil || !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), "Config.Policies") {
			t.Errorf("ParsePolicies(%q) = %v, want an error naming Config.Policies saying %q", in, err, want)
		}
	}
}

// A delay is never shorter than its rule says, doubles per earlier delay of the event,
// stops doubling at the cap, and is jittered (by at most a fifth) so that events delayed
// together do not come back together.
func TestDelayWaitDoublesToCapWithJitter(t *testing.T) {
	t.Parallel()
	r := Rule{Policy: Delay, Delay: time.Second, MaxDelay: 5 * time.Second}
	for n, base := range []time.Duration{time.Second, 2 * time.Second, 4 * time.Second, 5 * time.Second, 5 * time.Second, 5 * time.Second} {
		seen := map[time.Duration]bool{}
		for range 50 {
			w := r.wait(n)
			if w < base || w > base+base/5 {
				t.Fatalf("wait(%d) = %s, want in [%s, %s]", n, w, base, base+base/5)
			}
			seen[w] = true
		}
		if len(seen) < 10 {
			t.Errorf("wait(%d): only %d distinct values in 50: no jitter", n, len(seen))
		}
	}
	if w := r.wait(1000); w > 6*time.Second {
		t.Errorf("wait(1000) = %s: the cap did not hold", w)
	}
}

// A table naming a type outside the known ones is refused with the field, the entry
// and the known types: a typo (comment.create) would otherwise leave the type it meant
// to the default rule, and a rule for a type nobody runs never applies.
func TestCheckTypesRefusesUnknownTypes(t *testing.T) {
	t.Parallel()
	known := []string{"triage.requested", "comment.created"}
	for _, in := range []string{"drop", "comment.created=deliver,*=drop", "triage.requested=delay:1s"} {
		p, err := ParsePolicies(in)
		if err != nil {
			t.Fatal(err)
		}
		if err := p.CheckTypes(known); err != nil {
			t.Errorf("%q: %v", in, err)
		}
	}
	p, err := ParsePolicies("comment.create=deliver,*=drop")
	if err != nil {
		t.Fatal(err)
	}
	err = p.CheckTypes(known)
	want := `lockmw: Config.Policies entry "comment.create=deliver": comment.create is not an event type a worker runs: one of triage.requested, comment.created`
	if err == nil || err.Error() != want {
		t.Errorf("CheckTypes = %v, want %s", err, want)
	}
}
