package pipeline_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/redis/go-redis/v9"

	"github.com/ymirflow/ymirflow/event"
	"github.com/ymirflow/ymirflow/internal/redistest"
	"github.com/ymirflow/ymirflow/lockmw/lease"
	"github.com/ymirflow/ymirflow/pipeline"
	"github.com/ymirflow/ymirflow/pipeline/pipelinetest"
)

// env is one test's pipeline: its own namespace for streams and leases on the shared
// test Redis.
type env struct {
	*pipelinetest.Env
	t    testing.TB
	rdb  *redis.Client
	ns   string
	topo event.Topology
	pub  *event.Publisher
	opts *redis.UniversalOptions
}

func newEnv(t testing.TB) *env { return envOf(t, pipelinetest.New(t)) }

// newEnvOn is an env on a private server, for tests that restart it.
func newEnvOn(t testing.TB, srv *redistest.Server) *env {
	return envOf(t, pipelinetest.OnServer(t, srv.Client(), srv.URL()))
}

func envOf(t testing.TB, re *pipelinetest.Env) *env {
	return &env{Env: re, t: t, rdb: re.Client, ns: re.Namespace, topo: re.Topology, pub: re.Publisher, opts: re.Options}
}

func (e *env) locker(ttl time.Duration) *lease.Locker { return e.TriageLocker(ttl) }

// routerOpts are the knobs tests turn; the rest are fast defaults.
type routerOpts = pipelinetest.TriageOptions

func (e *env) start(ctx context.Context, o routerOpts, h message.NoPublishHandlerFunc) (*pipeline.Router, <-chan error) {
	e.t.Helper()
	return e.StartTriage(ctx, o, h)
}

func (e *env) triage() string { return e.TriageStream() }

func (e *env) publishTriage(key string) string { return e.PublishTriage(key) }

func (e *env) results(eventType string) []redis.XMessage { return e.Records(eventType) }

func (e *env) dead() []redis.XMessage { return e.Dead() }

func (e *env) pending(stream string) int64 { return e.Pending(stream, "triage") }

// runs counts handler runs per issue key.
type runs = pipelinetest.Runs

func issueOf(msg *message.Message) string { return msg.Metadata.Get(event.MetaIssueKey) }

var errBoom = errors.New("boom")
