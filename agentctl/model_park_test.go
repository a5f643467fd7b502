package agentctl_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"testing"

	"github.com/ymirflow/ymirflow/agentctl"
	"github.com/ymirflow/ymirflow/internal/xonce"
)

// The parked requests in the model: a run's request is parked (its budget ran out),
// and approvals resume them, crashing before or after a publish. Whatever crashes, a
// parked request is parked still or published (ParkedNotLost), and never published
// twice (ParkedPublishedOnce).

var errCrash = errors.New("model: the process died here")

// parkedStream is where the model's resumes publish.
func (m *mWorld) parkedStream() string { return m.w.ns + "model:resumed" }

// publishParked is the model's publish: the idempotent append a PublishParked makes
// (event.Publisher.PublishOnce), by the parked request's OnceID.
func (m *mWorld) publishParked(ctx context.Context, p agentctl.Parked) (string, error) {
	return xonce.Run(ctx, m.w.rdb, xonce.Append{Stream: m.parkedStream(), ID: p.OnceID(), TTL: agentctl.ParkedOnceTTL,
		Values: map[string]any{"parked": p.ID, "agent": p.Agent}})
}

// crashingPublish publishes as publishParked does, dying at crash: before the publish
// (it returns an error), or after it (the context is cancelled: nothing more reaches
// Redis, the forget included).
func crashingPublish(m *mWorld, crash int, cancel context.CancelFunc) agentctl.PublishParked {
	return func(ctx context.Context, p agentctl.Parked) (string, error) {
		if crash == crashBeforePublish {
			cancel()
			return "", errCrash
		}
		id, err := m.publishParked(ctx, p)
		if crash == crashAfterPublish {
			cancel()
		}
		return id, err
	}
}

// resumeLedger is the ledger's own resume.
func resumeLedger(ctx context.Context, m *mWorld, crash int) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	_, err := m.w.ledger.ResumeParked(ctx, m.issue, crashingPublish(m, crash, cancel))
	return err
}

func (m *mWorld) park(agent string, i int) {
	ctx := context.Background()
	if err := m.w.ledger.Park(ctx, m.issue, agentctl.Parked{Agent: agent, Stream: "s", EventType: "e", Payload: []byte(`{}`)}); err != nil {
		m.t.Fatal(err)
	}
	parked, err := m.w.ledger.ParkedRequests(ctx, m.issue)
	if err != nil {
		m.t.Fatal(err)
	}
	for _, p := range parked {
		if p.Agent == agent {
			m.owed[agent] = p.ID // the newest replaces an older one of the agent
		}
	}
	m.trace = append(m.trace, fmt.Sprintf("%d park %s: %s", i, agent, m.owed[agent]))
}

func (m *mWorld) resumeParked(i int) {
	crash := m.rng.IntN(3)
	err := m.resume(context.Background(), m, crash)
	m.trace = append(m.trace, fmt.Sprintf("%d resume (crash %d): %v", i, crash, err))
	if crash == crashNone && err != nil {
		m.t.Fatal(err)
	}
}

// checkParked holds the two properties: every owed request is parked or published,
// and no parked request was published twice. One seen published and no longer parked
// is paid.
func (m *mWorld) checkParked(ctx context.Context) {
	entries, err := m.w.rdb.XRange(ctx, m.parkedStream(), "-", "+").Result()
	if err != nil {
		m.t.Fatal(err)
	}
	published := map[string]bool{}
	for _, e := range entries {
		id, _ := e.Values["parked"].(string)
		if published[id] {
			m.fail(propParkedOnce, "parked request %s published twice", id)
		}
		published[id] = true
	}
	raw, err := m.w.rdb.HGetAll(ctx, m.w.ns+"ctl:{"+m.issue+"}:parked").Result()
	if err != nil {
		m.t.Fatal(err)
	}
	for agent, id := range m.owed {
		var p agentctl.Parked
		parked := raw[agent] != "" && json.Unmarshal([]byte(raw[agent]), &p) == nil && p.ID == id
		switch {
		case !parked && !published[id]:
			m.fail(propParkedKept, "%s's parked request %s is neither parked nor published", agent, id)
		case !parked:
			delete(m.owed, agent)
		}
	}
}

// resumeDeleteFirst is a planted defect: the resume as it was, each request taken
// (HDEL) before it is published; a crash in between loses it.
func resumeDeleteFirst(ctx context.Context, m *mWorld, crash int) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	key := m.w.ns + "ctl:{" + m.issue + "}:parked"
	all, err := m.w.rdb.HGetAll(ctx, key).Result()
	if err != nil {
		return err
	}
	publish := crashingPublish(m, crash, cancel)
	for agent, raw := range all {
		if n, err := m.w.rdb.HDel(ctx, key, agent).Result(); err != nil || n == 0 {
			continue
		}
		var p agentctl.Parked
		_ = json.Unmarshal([]byte(raw), &p)
		if _, err := publish(ctx, p); err != nil {
			return err
		}
	}
	return nil
}

// TestModelLedgerPlantedDeleteFirst: the model's checker catches a resume that deletes
// a parked request before publishing it (the request is lost by a crash in between).
func TestModelLedgerPlantedDeleteFirst(t *testing.T) {
	for seed := 1; seed <= 25; seed++ {
		if f := runModel(t, seed, resumeDeleteFirst, true); f != nil {
			if f.prop != propParkedKept {
				t.Fatalf("seed %d: the planted defect broke %s (%s), want %s", seed, f.prop, f.msg, propParkedKept)
			}
			t.Logf("seed %d: %s: %s", seed, f.prop, f.msg)
			return
		}
	}
	t.Fatal("the model did not catch a resume that deletes a parked request before publishing it")
}

// resumeNotIdempotent is a planted defect: the ledger's resume with a publish that is
// not idempotent (a new append id each time); a crash after a publish and before the
// forget publishes the request again at the next resume.
func resumeNotIdempotent(ctx context.Context, m *mWorld, crash int) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	_, err := m.w.ledger.ResumeParked(ctx, m.issue, func(ctx context.Context, p agentctl.Parked) (string, error) {
		if crash == crashBeforePublish {
			cancel()
			return "", errCrash
		}
		id, err := xonce.Run(ctx, m.w.rdb, xonce.Append{Stream: m.parkedStream(), ID: xonce.NewID(),
			Values: map[string]any{"parked": p.ID, "agent": p.Agent}})
		if crash == crashAfterPublish {
			cancel()
		}
		return id, err
	})
	return err
}

// TestModelLedgerPlantedRepublish: the checker catches a resume whose publish is not
// idempotent by the parked request's id.
func TestModelLedgerPlantedRepublish(t *testing.T) {
	for seed := 1; seed <= 25; seed++ {
		if f := runModel(t, seed, resumeNotIdempotent, true); f != nil {
			if f.prop != propParkedOnce {
				t.Fatalf("seed %d: the planted defect broke %s (%s), want %s", seed, f.prop, f.msg, propParkedOnce)
			}
			t.Logf("seed %d: %s: %s", seed, f.prop, f.msg)
			return
		}
	}
	t.Fatal("the model did not catch a resume that publishes a parked request twice")
}
