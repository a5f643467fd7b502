package config

import (
	"strings"
	"testing"
	"time"
)

func TestDemoSpeed(t *testing.T) {
	// Not parallel: it sets the process environment (clearEnv, t.Setenv), which is one per process: Go refuses t.Setenv in a parallel test.
	clearEnv(t)
	for _, tc := range []struct {
		speed string
		want  time.Duration
	}{
		{"1", DefaultDemoDuration},
		{"2", DefaultDemoDuration / 2},
		{"4x", DefaultDemoDuration / 4},
		{"0.5", 2 * DefaultDemoDuration},
		{"300ms", 300 * time.Millisecond},
		{"0s", 0},
	} {
		var d Demo
		if err := load(t, "demo", &d, "--speed", tc.speed); err != nil {
			t.Fatalf("--speed %s: %v", tc.speed, err)
		}
		if got, _ := d.AgentDuration(); got != tc.want {
			t.Errorf("--speed %s: agent duration %s, want %s", tc.speed, got, tc.want)
		}
	}
	for _, bad := range []string{"0", "-2", "fast", "-1s"} {
		err := load(t, "demo", &Demo{}, "--speed", bad)
		if !hasSetting(err, "SPEED", "speed") {
			t.Errorf("--speed %s: %v, want a SPEED setting error", bad, err)
		}
	}
	var d Demo
	if err := load(t, "demo", &d); err != nil {
		t.Fatal(err)
	}
	if d.Issues != DefaultDemoIssues || d.Keep || d.JSON || d.LogFile != "" || d.Speed != "1" {
		t.Errorf("demo defaults: %+v", d)
	}
	if err := load(t, "demo", &Demo{}, "--issues", "0"); err == nil || !strings.Contains(err.Error(), "ISSUES") {
		t.Errorf("--issues 0: %v", err)
	}
}
