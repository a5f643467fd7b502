package lockmw_test

import (
	"strings"
	"testing"
	"time"

	"github.com/ymirflow/ymirflow/internal/redistest"
	"github.com/ymirflow/ymirflow/lockmw"
	"github.com/ymirflow/ymirflow/lockmw/lease"
)

// The wait policy is refused where its line could be missed: beside coalesce, deliver
// or supersede, with a shared scope, and without a stream to put the copies into; each
// refusal names the setting.
func TestNewMiddlewareRefusesWaitWhereALineCouldBeMissed(t *testing.T) {
	t.Parallel()
	rdb, ns := redistest.Client(t)
	l := locker(t, rdb, ns)
	src := &streamSource{}
	for _, c := range []struct {
		policies, scope string
		source          bool
		want            string
	}{
		{"rebase.requested=wait,*=coalesce", "agent", true, "wait can be combined with drop and delay only"},
		{"rebase.requested=wait,*=supersede", "agent", true, "wait can be combined with drop and delay only"},
		{"wait", "issue", true, "cannot be combined with Config.Scopes"},
		{"wait", "agent", false, "policy wait needs Config.Source"},
	} {
		pol, err := lockmw.ParsePolicies(c.policies)
		if err != nil {
			t.Fatal(err)
		}
		sc, err := lease.ParseScopes(c.scope)
		if err != nil {
			t.Fatal(err)
		}
		cfg := lockmw.Config{Locker: l, Agent: "rebase", Policies: pol, Scopes: sc, MaxIdleTime: time.Hour}
		if c.source {
			cfg.Source = src
		}
		if _, err := lockmw.NewMiddleware(cfg); err == nil || !strings.Contains(err.Error(), c.want) || !strings.Contains(err.Error(), "Config.") {
			t.Errorf("%s with scope %s: %v, want %q", c.policies, c.scope, err, c.want)
		}
	}
	pol, _ := lockmw.ParsePolicies("rebase.requested=wait:3,*=delay:1s")
	if _, err := lockmw.NewMiddleware(lockmw.Config{Locker: l, Agent: "rebase", Policies: pol, Source: src, MaxIdleTime: time.Hour}); err != nil {
		t.Fatalf("wait beside delay: %v", err)
	}
}
