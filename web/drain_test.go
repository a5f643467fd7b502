package web_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ymirflow/ymirflow/internal/drainreq"
	"github.com/ymirflow/ymirflow/internal/presence"
	"github.com/ymirflow/ymirflow/web"
)

// TestConsoleShowsDrain: with a drain request standing and a worker that reports
// drained, the overview's banner names the request and the count, the consumers table
// shows the worker drained, GET /api/v1/drains lists it, and an operator's
// POST /api/v1/drain of one worker is answered with the requests; a target of nothing
// is a 400.
func TestConsoleShowsDrain(t *testing.T) {
	t.Parallel()
	e := rolesEnv(t)
	ctx := context.Background()
	e.publish("RHEL-1")
	e.rdb.XGroupCreateMkStream(ctx, e.topo.Stream("triage", "", false), e.topo.Group("triage", ""), "0")
	beat := presence.Beat{Consumer: "w1-0", Stream: e.topo.Stream("triage", "", false), Group: e.topo.Group("triage", ""),
		Agent: "triage", Host: "h", PID: 1, Drain: drainreq.Drained, DrainReason: "upgrade"}
	b, _ := json.Marshal(beat)
	e.rdb.ZAdd(ctx, e.topo.Workers(), redis.Z{Score: float64(time.Now().Add(time.Minute).UnixMilli()), Member: string(b)})
	req := drainreq.Request{Target: drainreq.Target{Agent: "triage"}, Who: "otto", Reason: "upgrade", At: time.Now()}
	e.rdb.HSet(ctx, e.topo.Drains(), req.Target.Field(), req.Encode())
	code, page := e.get("/")
	if code != 200 || !strings.Contains(page, `id="drain-banner"`) || !strings.Contains(page, "1/1 workers drained") ||
		!strings.Contains(page, `drain-drained`) {
		t.Fatalf("overview %d lacks the drain banner or state:\n%s", code, page)
	}
	var rep web.DrainsReport
	code, body := e.get("/api/v1/drains")
	if err := json.Unmarshal([]byte(body), &rep); code != 200 || err != nil || len(rep.Drains) != 1 || rep.Drains[0].Drained != 1 {
		t.Fatalf("GET /api/v1/drains: %d %s", code, body)
	}
	hdr := map[string]string{"Content-Type": "application/json", "Authorization": "Bearer " + operatorToken}
	code, body, _ = e.do("POST", "/api/v1/drain", `{"worker":"w2","reason":"node reboot"}`, hdr)
	if err := json.Unmarshal([]byte(body), &rep); code != 200 || err != nil || len(rep.Drains) != 2 {
		t.Fatalf("POST /api/v1/drain: %d %s", code, body)
	}
	if code, body, _ = e.do("POST", "/api/v1/drain", `{"reason":"nothing"}`, hdr); code != 400 {
		t.Fatalf("POST /api/v1/drain of no target: %d %s, want 400", code, body)
	}
}
