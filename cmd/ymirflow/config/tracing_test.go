package config

import (
	"bytes"
	"errors"
	"flag"
	"strings"
	"testing"
)

// Tracing is off by default and turned on by the standard OpenTelemetry variables or
// their flags; bad values are refused at start naming the variable and the flag, and a
// password in the endpoint never reaches the message.
func TestTracingSettings(t *testing.T) {
	// Not parallel: it sets the process environment (clearEnv, t.Setenv), which Go refuses in a parallel test.
	clearEnv(t)
	var w Worker
	if err := load(t, "worker", &w, demoWorker()...); err != nil {
		t.Fatal(err)
	}
	if w.Tracing.Config("worker").On() {
		t.Fatal("tracing on by default")
	}

	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://otel-collector:4318")
	t.Setenv("OTEL_SERVICE_NAME", "ymir-prod")
	w = Worker{}
	if err := load(t, "worker", &w, demoWorker()...); err != nil {
		t.Fatal(err)
	}
	if c := w.Tracing.Config("worker"); !c.On() || c.Endpoint != "http://otel-collector:4318" || c.ServiceName != "ymir-prod" {
		t.Fatalf("tracing config %+v", c)
	}
	w = Worker{}
	if err := load(t, "worker", &w, demoWorker("--traces-exporter", "none")...); err != nil || w.Tracing.Config("worker").On() {
		t.Fatalf("--traces-exporter none: %v, on=%v", err, w.Tracing.Config("worker").On())
	}

	for _, c := range []struct {
		cmd      string
		settings Command
		env, val string
		flag     string
	}{
		{"worker", &Worker{}, "OTEL_TRACES_EXPORTER", "jaeger", "traces-exporter"},
		{"fetch", &Fetch{}, "OTEL_EXPORTER_OTLP_ENDPOINT", "http://user:hunter2pw@collector:4318", "otlp-endpoint"},
		{"webhook", &Webhook{}, "OTEL_EXPORTER_OTLP_ENDPOINT", "collector:4318", "otlp-endpoint"},
		{"web", &Web{}, "TRACE_URL_TEMPLATE", "https://jaeger.example.com/trace/", "trace-url-template"},
	} {
		clearEnv(t)
		t.Setenv(c.env, c.val)
		var args []string
		if c.cmd == "worker" {
			args = demoWorker()
		}
		err := load(t, c.cmd, c.settings, args...)
		var se *SettingError
		if !errors.As(err, &se) || !strings.Contains(err.Error(), c.env+" (--"+c.flag+")") {
			t.Errorf("%s with %s=%q: %v, want an error naming %s (--%s)", c.cmd, c.env, c.val, err, c.env, c.flag)
		}
		if err != nil && strings.Contains(err.Error(), "hunter2pw") {
			t.Errorf("the endpoint's password is in the message: %v", err)
		}
	}

	fs := flag.NewFlagSet("worker", flag.ContinueOnError)
	(&Worker{}).Register(fs)
	var help bytes.Buffer
	WriteUsage(&help, fs)
	for _, want := range []string{"--traces-exporter", "OTEL_TRACES_EXPORTER", "--otlp-endpoint", "OTEL_EXPORTER_OTLP_ENDPOINT", "--service-name", "OTEL_SERVICE_NAME"} {
		if !strings.Contains(help.String(), want) {
			t.Errorf("worker --help lacks %s", want)
		}
	}
}
