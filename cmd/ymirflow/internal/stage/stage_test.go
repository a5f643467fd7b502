package stage_test

import (
	"strings"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/redis/go-redis/v9"

	"github.com/ymirflow/ymirflow/cmd/ymirflow/internal/stage"
	"github.com/ymirflow/ymirflow/event"
	"github.com/ymirflow/ymirflow/handlers"
	"github.com/ymirflow/ymirflow/internal/redistest"
	"github.com/ymirflow/ymirflow/lockmw/lease"
	"github.com/ymirflow/ymirflow/pipeline"
	"github.com/ymirflow/ymirflow/runners/demorunner"
)

func config(t *testing.T, agent string) stage.Config {
	t.Helper()
	rdb, ns := redistest.Client(t)
	opts := rdb.Options()
	topo := event.Topology{Namespace: strings.TrimSuffix(ns, ":")}
	locker, err := lease.New(rdb, lease.Options{Scope: topo.LockScope()})
	if err != nil {
		t.Fatal(err)
	}
	return stage.Config{
		Router: pipeline.RouterConfig{Client: rdb, ClientOptions: &redis.UniversalOptions{Addrs: []string{opts.Addr}, DB: opts.DB},
			Topology: topo, Agent: agent, Branch: "c10s", Consumer: "stage-test", Locker: locker},
		Handler: handlers.Config{Runner: demorunner.Runner{}, Results: event.NewResults(rdb, topo.Results(), event.DefaultMaxLen)},
	}
}

// The handler's stage is the router's: set once, on the router.
func TestNewTakesTheHandlersStageFromTheRouter(t *testing.T) {
	c := config(t, "rebase")
	wrapped := 0
	c.Wrap = func(h message.NoPublishHandlerFunc) message.NoPublishHandlerFunc {
		if h == nil {
			t.Error("Wrap got a nil handler")
		}
		wrapped++
		return h
	}
	r, err := stage.New(c)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	if r == nil || wrapped != 1 {
		t.Fatalf("router %v, handler wrapped %d times, want a router and 1", r, wrapped)
	}
}

// A stage the handlers do not know is refused, by the handler's check of the router's agent.
func TestNewRefusesAnUnknownAgent(t *testing.T) {
	_, err := stage.New(config(t, "no-such-agent"))
	if err == nil || !strings.Contains(err.Error(), "handlers:") {
		t.Fatalf("New with agent no-such-agent: %v, want the handlers' refusal", err)
	}
}
