package agentctl_test

import (
	"testing"

	"github.com/ymirflow/ymirflow/agentctl"
)

func TestParseApproval(t *testing.T) {
	for body, want := range map[string]float64{
		"/ymir budget +25":                       25,
		"looks fine\n/ymir budget +2.50\nthanks": 2.5,
		"/ymir budget +0":                        0,
		"/ymir budget 25":                        0,
		"/ymir budget +99999":                    0,
		"please /ymir budget +25":                0,
		"/ymir budget +1e9":                      0,
	} {
		got, ok := agentctl.ParseApproval(body)
		if got != want || ok != (want > 0) {
			t.Errorf("%q: %v %v, want %v", body, got, ok, want)
		}
	}
}
