package event_test

import (
	"errors"
	"regexp"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/ymirflow/ymirflow/event"
	"github.com/ymirflow/ymirflow/internal/redistest"
)

// TestMain pings the shared test Redis once: with it down, the package fails at once with
// one line naming the URL and how to start a server.
func TestMain(m *testing.M) { redistest.Main(m) }

var errInvalidKey = errors.New("invalid issue key")

// keyPattern is the lease's default key pattern: project, dash, number.
var keyPattern = regexp.MustCompile(`^[A-Z][A-Z0-9_]*-[1-9][0-9]*$`)

// canonical canonicalises keys as the lease does by default (trim, uppercase, check the
// pattern); the event package takes it as a plain function so that it needs no lease.
func canonical(raw string) (string, error) {
	k := strings.ToUpper(strings.TrimSpace(raw))
	if len(k) > 100 || !keyPattern.MatchString(k) {
		return "", errInvalidKey
	}
	return k, nil
}

// env is one test's streams: its own namespace on the shared test Redis, deleted when
// the test ends.
type env struct {
	rdb  *redis.Client
	topo event.Topology
}

func newEnv(t testing.TB) *env {
	rdb, ns := redistest.Client(t)
	return &env{rdb: rdb, topo: event.Topology{Namespace: ns + "ymir"}}
}

func (e *env) triage() string { return e.topo.Stream("triage", "", false) }
