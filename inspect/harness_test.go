package inspect_test

import (
	"errors"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/ymirflow/ymirflow/event"
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
