package lockmw_test

import (
	"strings"
	"testing"

	"github.com/ymirflow/ymirflow/lockmw"
)

func TestParseLimits(t *testing.T) {
	l, err := lockmw.ParseLimits("rebase=4, field:metadata.component=1,field:m:team=2,fair:metadata.component,weight:kernel=3")
	if err != nil {
		t.Fatal(err)
	}
	if l.Agents["rebase"] != 4 || len(l.Fields) != 2 || l.Fields[0] != (lockmw.FieldLimit{Path: "metadata.component", N: 1}) ||
		l.Fields[1] != (lockmw.FieldLimit{Path: "m:team", N: 2}) || l.FairField != "metadata.component" || l.Weights["KERNEL"] != 3 {
		t.Fatalf("parsed %+v", l)
	}
	if l, err := lockmw.ParseLimits(""); err != nil || !l.Empty() {
		t.Fatalf("empty: %+v, %v", l, err)
	}
	for _, bad := range []string{"rebase=0", "rebase", "rebase=x", "field:=1", "field:a+b=1", "rebase=1,rebase=2",
		"weight:kernel=3", "fair:", "fair:a,fair:b", "weight:kernel=0,fair:c", "re:base=1"} {
		if _, err := lockmw.ParseLimits(bad); err == nil || !strings.Contains(err.Error(), "want") && !strings.Contains(err.Error(), "bad") &&
			!strings.Contains(err.Error(), "twice") && !strings.Contains(err.Error(), "needs") && !strings.Contains(err.Error(), "one fair") {
			t.Errorf("%q: %v, want an error", bad, err)
		}
	}
}
