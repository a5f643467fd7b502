package main

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"regexp"
	"testing"
	"time"

	"github.com/ymirflow/ymirflow/inspect"
	"github.com/ymirflow/ymirflow/internal/redact"
	"github.com/ymirflow/ymirflow/internal/testlog"
)

// `demo --web` prints the console's URL and serves the demo's run there until Ctrl-C.
func TestDemoServesTheConsole(t *testing.T) {
	logFile := demoEnv(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var out, errb testlog.Buffer
	done := make(chan int, 1)
	go func() {
		done <- run(ctx, []string{"demo", "--web", "127.0.0.1:0", "--issues", "6", "--speed", "0s", "--log-file", logFile}, &out, &errb)
	}()
	urlRE := regexp.MustCompile(`Console: (http://127\.0\.0\.1:[0-9]+/)`)
	var base string
	var dead inspect.DeadLettersReport
	deadline := time.Now().Add(60 * time.Second)
	for {
		if m := urlRE.FindStringSubmatch(out.String()); m != nil && base == "" {
			base = m[1]
		}
		if base != "" {
			// Once the demo is done its dead letters are there, and the console keeps serving.
			if resp, err := http.Get(base + "api/v1/dead-letters"); err == nil {
				b, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				if resp.StatusCode == 200 && json.Unmarshal(b, &dead) == nil && len(dead.DeadLetters) > 0 && regexp.MustCompile(`Done in`).MatchString(out.String()) {
					break
				}
			}
		}
		select {
		case code := <-done:
			t.Fatalf("demo ended (exit %d) while it should serve the console\nstdout:\n%s\nstderr:\n%s", code, out.String(), errb.String())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("no console with the demo's dead letters within 60s (url %q)\nstdout:\n%s", base, out.String())
		}
		time.Sleep(100 * time.Millisecond)
	}
	resp, err := http.Get(base)
	if err != nil || resp.StatusCode != 200 || resp.Header.Get("Content-Security-Policy") == "" {
		t.Fatalf("overview: %v %v", resp, err)
	}
	resp.Body.Close()
	cancel()
	select {
	case code := <-done:
		if code != exitOK {
			t.Fatalf("exit %d after Ctrl-C\n%s", code, errb.String())
		}
	case <-time.After(15 * time.Second):
		t.Fatal("the demo did not stop after Ctrl-C")
	}
}

// The console's token is one of ymirflow's own secrets: nothing a command prints shows it.
func TestWebTokenIsASecret(t *testing.T) {
	f := t.TempDir() + "/token"
	if err := os.WriteFile(f, []byte("file-token-0123456789\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	env := map[string]string{"WEB_TOKEN": "env-token-0123456789", "WEB_TOKEN_FILE": f}
	red := redact.New(environSecrets(func(k string) string { return env[k] })...)
	if got := red.String("env-token-0123456789 file-token-0123456789"); got != "[redacted] [redacted]" {
		t.Fatalf("redacted: %q", got)
	}
}
