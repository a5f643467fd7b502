package config

import (
	"github.com/ymirflow/ymirflow/event"
	"github.com/ymirflow/ymirflow/fetcher"
)

// Defaults shared by several commands and by the deployment manifests (each command's
// own are in its file). Where a library owns a setting (the lease, the router, the Jira
// client, the runner, the fetcher), the default is the library's, referenced here, never
// re-declared.
const (
	DefaultRedisURL  = "redis://127.0.0.1:6379/0"
	DefaultNamespace = event.DefaultNamespace
	DefaultMaxLen    = event.DefaultMaxLen
	// DefaultMetricsAddr is a free port on loopback, so that several workers (and the
	// webhook) share a machine; a deployment that scrapes them sets METRICS_ADDR (the
	// manifests: :9090). The port taken is logged at start.
	DefaultMetricsAddr    = "127.0.0.1:0"
	DefaultStaleThreshold = fetcher.DefaultStaleLabelThreshold
	DefaultMaxEventBytes  = event.DefaultMaxEventBytes
)
