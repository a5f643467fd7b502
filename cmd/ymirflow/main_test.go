package main

import (
	"testing"

	"github.com/ymirflow/ymirflow/internal/redistest"
)

// TestMain pings the shared test Redis once: with it down, the package fails at once with
// one line naming the URL and how to start a server, instead of every test and example
// failing or hanging on its own.
//
// Most tests here are not parallel: the commands under test run in-process and read their
// settings from the process environment, which the helpers set (t.Setenv: REDIS_URL,
// YMIR_NAMESPACE, and every other setting cleared), and Go refuses t.Setenv in a parallel
// test; the process tests also time the binary's start and exit. Those that read no
// setting say t.Parallel.
func TestMain(m *testing.M) { redistest.Main(m) }
