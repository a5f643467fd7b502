package inspect_test

import (
	"context"
	"errors"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/ymirflow/ymirflow/event"
	"github.com/ymirflow/ymirflow/internal/audit"
	"github.com/ymirflow/ymirflow/pipeline/pipelinetest"
)

// env is one test's pipeline (pipelinetest.Env: its own namespace for streams and leases
// on the shared test Redis) and the test it belongs to, for the helpers of this package.
type env struct {
	*pipelinetest.Env
	t testing.TB
}

func newEnv(t testing.TB) *env { return &env{Env: pipelinetest.New(t), t: t} }

func issueOf(msg *message.Message) string { return msg.Metadata.Get(event.MetaIssueKey) }

var errBoom = errors.New("boom")

// asOperator is ctx carrying an operator, as the CLI and the console give the
// Inspector's writes (they refuse to run without one: audit.ErrNoActor).
func asOperator(ctx context.Context) context.Context {
	return audit.WithOperator(ctx, audit.Operator{Who: "tester@host", From: "test", Reason: "a test"})
}
