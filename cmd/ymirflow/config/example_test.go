package config_test

import (
	"fmt"

	"github.com/ymirflow/ymirflow/cmd/ymirflow/config"
)

// A worker's settings come from its flags (and, for flags not given, from the
// environment: LOCK_TTL, BLOCK_TIME, ...). Validation names each bad setting
// by its environment variable and its flag.
func ExampleLoad() {
	var w config.Worker
	_, err := config.Load("worker", &w, []string{
		"--agent", "backport", "--branch", "c9s", "--runner", "demo",
		"--lock-ttl", "90s", "--max-idle-time", "45s", "--block-time", "2s", "--kill-grace", "5s",
	})
	fmt.Println("error:", err)
	fmt.Println(w.Agent, w.Branch, w.LockTTL, w.HeartbeatInterval(), w.ShutdownBudget())

	_, err = config.Load("worker", &config.Worker{}, []string{
		"--agent", "rebase", "--branch", "c10s", "--runner", "demo", "--lock-ttl", "300s", "--max-idle-time", "1m",
	})
	fmt.Println(err)
	// Output:
	// error: <nil>
	// backport c9s 1m30s 30s 8s
	// MAX_IDLE_TIME (--max-idle-time) = 1m must exceed the lease heartbeat interval LOCK_TTL/3 = 1m40s; LOCK_TTL (--lock-ttl) is 5m
}

func ExampleEnvNamesOf() {
	fmt.Println(config.EnvNamesOf("fetch"))
	// Output:
	// [DRY_RUN INTERVAL JIRA_API JIRA_COMMENT_GROUP JIRA_EMAIL JIRA_JQL JIRA_MAX_RETRIES JIRA_RATE JIRA_RATE_BURST JIRA_RATE_LIMIT JIRA_TIMEOUT JIRA_TOKEN JIRA_TOKEN_FILE JIRA_TRIGGER_GROUP JIRA_URL LOG_FORMAT LOG_LEVEL MAX_EVENT_BYTES MAX_ISSUES MAX_LEN ONCE OTEL_EXPORTER_OTLP_ENDPOINT OTEL_SERVICE_NAME OTEL_TRACES_EXPORTER REDIS_URL STALE_LABEL_THRESHOLD YMIR_NAMESPACE]
}
