package lease

// Planted defects (issue 34, "Done when"): each subtest plants one defect in the
// lease's Lua, by string replacement on the embedded source, loads the mutated scripts
// in place of the real ones for its run only, and requires TestModelLease's checker,
// at its default size (48 seeds of 60 steps), to fail. A checker that passes the real
// scripts (TestModelLease) and fails each of these is not vacuous.

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ymirflow/ymirflow/internal/redistest"
	"github.com/ymirflow/ymirflow/internal/xonce"
)

// leaseLua is the lease's steps as the scripts join them (newScript(xonce.IndexLua,
// leaseSteps, ...)), for the tests that plant a changed script.
var leaseLua = xonce.IndexLua + leaseSteps

// scriptBuild is one script of the package and how its source is put together, so
// that a plant in a shared step (lease.lua) reaches every script that includes it.
type scriptBuild struct {
	name string
	s    *script
	src  func() string
}

func scriptBuilds() []scriptBuild {
	return []scriptBuild{
		{"acquire", &acquireScript, func() string { return leaseLua + acquireLua }},
		{"acquire_scoped", &acquireScopedScript, func() string { return leaseLua + acquireScopedLua }},
		{"handoff", &handoffScript, func() string { return leaseLua + handoffLua }},
		{"handoff_batch", &handoffBatchScript, func() string { return leaseLua + handoffBatchLua }},
		{"acquire_or_queue", &acquireOrQueueScript, func() string { return leaseLua + acquireOrQueueLua }},
		{"acquire_or_deliver", &acquireOrDeliverScript, func() string { return leaseLua + acquireOrDeliverLua }},
		{"mailbox_done", &mailboxDoneScript, func() string { return mailboxDoneLua }},
		{"extend", &extendScript, func() string { return extendLua }},
		{"release", &releaseScript, func() string { return leaseLua + releaseLua }},
		{"force_release", &forceReleaseScript, func() string { return forceReleaseLua }},
		{"acquire_or_supersede", &acquireOrSupersede, func() string { return leaseLua + acquireOrSupersedeLua }},
		{"stop_wait", &stopWaitScript, func() string { return leaseLua + stopWaitLua }},
		{"acquire_shared", &acquireSharedScript, func() string { return leaseLua + acquireSharedLua }},
		{"unlock_shared", &unlockSharedScript, func() string { return leaseLua + unlockSharedLua }},
		{"acquire_or_wait", &acquireOrWaitScript, func() string { return leaseLua + lineLua + acquireOrWaitLua }},
		{"release_line", &releaseLineScript, func() string { return leaseLua + lineLua + releaseLineLua }},
		{"line_wake", &lineWakeScript, func() string { return leaseLua + lineLua + lineWakeLua }},
		{"acquire_or_wait_scoped", &acquireOrWaitScopedScript, func() string { return leaseLua + lineLua + lineScopedLua + acquireOrWaitScopedLua }},
		{"release_line_scoped", &releaseLineScopedScript, func() string { return leaseLua + lineLua + lineScopedLua + releaseLineScopedLua }},
		{"line_wake_scoped", &lineWakeScopedScript, func() string { return leaseLua + lineLua + lineScopedLua + lineWakeScopedLua }},
		{"release_line_shared", &releaseLineSharedScript, func() string { return leaseLua + lineLua + lineScopedLua + releaseLineSharedLua }},
	}
}

// plant is one defect: in the embedded source *src, old is replaced (once) by new.
type plant struct {
	src      *string
	old, new string
}

// plantScripts applies the plants and reloads every script whose source changed, until
// the test ends. It fails the test if a plant finds nothing to replace (a refactor of
// the Lua would otherwise make the test pass vacuously). It returns the planted source
// of each script that changed, by name.
func plantScripts(t *testing.T, plants ...plant) map[string]string {
	t.Helper()
	builds := scriptBuilds()
	for _, b := range builds {
		if b.src() != (*b.s).load().src {
			t.Fatalf("scriptBuilds is out of date: %s is not built as the package builds it", b.name)
		}
	}
	saved := map[*string]string{}
	savedLease := leaseLua
	for _, p := range plants {
		if _, ok := saved[p.src]; !ok {
			saved[p.src] = *p.src
		}
		planted := strings.Replace(*p.src, p.old, p.new, 1)
		if planted == *p.src {
			t.Fatalf("the plant found nothing to replace: %q", p.old)
		}
		*p.src = planted
	}
	leaseLua = xonce.IndexLua + leaseSteps // as scripts.go builds it
	before := make([]script, len(builds))
	changed := map[string]string{}
	for i, b := range builds {
		before[i] = *b.s
		if src := b.src(); src != (*b.s).load().src {
			*b.s = newScript(src)
			changed[b.name] = src
		}
	}
	if len(changed) == 0 {
		t.Fatal("the plants changed no script")
	}
	t.Cleanup(func() {
		for p, s := range saved {
			*p = s
		}
		leaseLua = savedLease
		for i, b := range builds {
			*b.s = before[i]
		}
	})
	return changed
}

// acquireScripts are the scripts that take the lease, one per policy (drop and delay
// share acquire.lua), and the step each must call in its own part, after the shared
// steps: a plant in that step reaches every policy.
func acquireScripts(step ...string) map[string][]string {
	m := map[string][]string{}
	for _, name := range []string{"acquire", "acquire_scoped", "acquire_or_queue", "acquire_or_deliver", "acquire_or_wait", "acquire_or_supersede"} {
		m[name] = step
	}
	return m
}

// requireHits fails the test unless each script of hits was changed by the plant and,
// after the shared steps it is built on, calls one of its steps.
func requireHits(t *testing.T, changed map[string]string, hits map[string][]string) {
	t.Helper()
	for name, steps := range hits {
		src, ok := changed[name]
		if !ok {
			t.Fatalf("the plant did not change %s", name)
		}
		if !strings.HasPrefix(src, leaseLua) {
			t.Fatalf("%s is not built on the planted lease steps", name)
		}
		own := strings.TrimPrefix(src, leaseLua)
		calls := false
		for _, s := range steps {
			calls = calls || strings.Contains(own, s+"(")
		}
		if !calls {
			t.Fatalf("%s calls none of %v: the plant does not reach its policy", name, steps)
		}
	}
}

// firstFailure runs the seeds [from, from+n) of TestModelLease (genConfig, stepKinds)
// or TestModelLeaseBatch (genBatchConfig, batchKinds) and stops at the first one that
// fails: its seed, its configuration and its violation (nil if none fails).
func (e *modelEnv) firstFailure(from, n int, cfgFor func(*rand.Rand) mConfig, kinds []stepKind) (int, mConfig, error) {
	for seed := from; seed < from+n; seed++ {
		r := rand.New(rand.NewPCG(uint64(seed), 34))
		cfg := cfgFor(r)
		if err := e.runModel(cfg, genSteps(r, 60, kinds)); err != nil {
			return seed, cfg, err
		}
	}
	return 0, mConfig{}, nil
}

// TestModelLeasePlantedDefects plants, one at a time, the four defects of issue 34's
// "Done when" in the lease's Lua and requires the model checker to catch each within
// its default size, by one of the properties that names it.
func TestModelLeasePlantedDefects(t *testing.T) {
	cases := []struct {
		name   string
		plants []plant
		props  []string // the properties that may catch it
		// hits are the scripts the plant must reach, each with the steps one of which
		// it calls (requireHits); nil for a plant in a step of one script.
		hits map[string][]string
	}{
		{
			// The release step's compare-and-delete without its compare: a stale run's
			// release deletes whoever holds the key now.
			name: "ReleaseDeletesForeignLease",
			plants: []plant{{&leaseSteps,
				"local mine = redis.call('GET', lock) == o.token",
				"local mine = redis.call('EXISTS', lock) == 1"}},
			props: []string{propHolder, propExclusive},
		},
		{
			// The acquire step's record (shared by take, line_take and the supersede
			// policy's takeover) reads the fence counter and adds one without storing it:
			// every acquire of the key, by any policy, gets the same fence.
			name: "FenceDoesNotIncrease",
			plants: []plant{{&leaseSteps,
				"  local f = redis.call('INCR', fence)\n",
				"  local f = tonumber(redis.call('GET', fence) or 0) + 1\n"}},
			props: []string{propFence},
			hits:  acquireScripts("acquire", "take", "line_take", "record"),
		},
		{
			// The release step deletes the queued follow-up and does not publish it.
			name: "DrainForgetsQueuedFollowup",
			plants: []plant{{&leaseSteps,
				"return {released, 1, publish_queued(q, o)}",
				"return {released}"}},
			props: []string{propStranded},
		},
		{
			// The acquire step without its "already mine" branch (own_repeat, shared by
			// every policy): the resent acquire after a lost reply finds its own token
			// and reports the key busy.
			name: "RepeatReportsOwnLeaseBusy",
			plants: []plant{{&leaseSteps,
				"  if cur ~= token then return nil, cur end\n",
				"  if true then return nil, cur end\n"}},
			props: []string{propAgrees},
			hits:  acquireScripts("acquire", "own_repeat"),
		},
	}
	e := newModelEnv(t)
	from, n := redistest.ModelSeeds(t, 48)
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			requireHits(t, plantScripts(t, c.plants...), c.hits)
			start := time.Now()
			seed, cfg, err := e.firstFailure(from, n, genConfig, stepKinds)
			if err == nil {
				t.Fatalf("the model checker passed %d seeds with the defect planted", n)
			}
			prop, _, _ := strings.Cut(err.Error(), ":")
			prop = strings.TrimPrefix(prop, "property ")
			var se *stepError
			at := "while settling"
			if errors.As(err, &se) {
				at = fmt.Sprintf("at step %d", se.at)
			}
			t.Logf("caught by property %s, seed %d (%s), %s, in %s: %v", prop, seed, cfg, at, time.Since(start).Round(time.Millisecond), err)
			for _, p := range c.props {
				if prop == p {
					return
				}
			}
			t.Fatalf("caught, but by property %s, not one of %v: %v", prop, c.props, err)
		})
	}
}

// plantLua is src with old replaced by new once: a planted defect. It fails t when src
// holds no old (the plant would test nothing).
func plantLua(t *testing.T, src, old, new string) string {
	t.Helper()
	planted := strings.Replace(src, old, new, 1)
	if planted == src {
		t.Fatalf("the plant found nothing to replace: %q", old)
	}
	return planted
}

// requireCaught fails t unless err, the violation the model checker found at seed with a
// defect planted, is one of props (any property when none is given); what says which
// defect went uncaught.
func requireCaught(t *testing.T, what string, seed int, err error, props ...string) {
	t.Helper()
	if err == nil {
		t.Fatal(what)
	}
	if len(props) > 0 && !slices.ContainsFunc(props, func(p string) bool { return strings.Contains(err.Error(), p) }) {
		t.Fatalf("caught, but as another property than %v: %v", props, err)
	}
	t.Logf("caught at seed %d: %v", seed, err)
}

// TestModelLeaseBatchPlantedDefects plants, one at a time, defects of the batched
// hand-off (handoff_batch.lua) and requires TestModelLeaseBatch's checker, at its default
// size, to catch each by one of the properties that names it.
func TestModelLeaseBatchPlantedDefects(t *testing.T) {
	cases := []struct {
		name  string
		plant func(t *testing.T, src string) string
		props []string
	}{
		{
			// The nexts' leases taken before the ends' releases (the reply laid out as
			// before): a next of an ended run's issue finds the key still held.
			name:  "AcquiresBeforeReleases",
			plant: acquiresFirst,
			props: []string{propAgrees},
		},
		{
			// The nexts' acquires without their entry time: the superseded check never
			// refuses an entry that entered before a release.
			name: "SkipsSupersededCheck",
			plant: func(t *testing.T, src string) string {
				return plantLua(t, src, "ARGV[a + 5], ARGV[a + 6], nil", "ARGV[a + 5], '', nil")
			},
			props: []string{propAgrees},
		},
		{
			// Each release dated when the batch ran, not when its run ended: an event
			// that entered in between counts as superseded by it.
			name: "DatesByTheBatch",
			plant: func(t *testing.T, src string) string {
				return plantLua(t, src, "return now - tonumber(ARGV[a + 7])", "return now")
			},
			props: []string{propBatch, propAgrees},
		},
		{
			// The batch-wide release deletes every end's key it finds held, its own or
			// not: a run whose lease expired and was taken by another deletes the new
			// holder's key.
			name: "DeletesAKeyNotItsOwn",
			plant: func(t *testing.T, src string) string {
				return plantLua(t, src, "if cur[i + 1] == ARGV[a + 1] then\n      table.insert(gone", "if cur[i + 1] then\n      table.insert(gone")
			},
			props: []string{propHolder, propExclusive, propAgrees, propBatch},
		},
		{
			// The batch-wide release never looks for queues: a follow-up queued behind
			// an ended run's key is left there, unpublished.
			name: "IgnoresAQueue",
			plant: func(t *testing.T, src string) string {
				return plantLua(t, src, "if #queues > 0 and redis.call('EXISTS', unpack(queues)) > 0 then return false end", "")
			},
			props: []string{propFollowup, propStranded, propAgrees, propBatch},
		},
	}
	e := newModelEnv(t)
	from, n := redistest.ModelSeeds(t, 16)
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			saved := handoffBatchScript
			handoffBatchScript = newScript(leaseLua + c.plant(t, handoffBatchLua))
			t.Cleanup(func() { handoffBatchScript = saved })
			seed, _, err := e.firstFailure(from, n, genBatchConfig, batchKinds)
			requireCaught(t, "the model checker did not catch a batch "+c.name, seed, err, c.props...)
		})
	}
}

// acquiresFirst plants, in handoff_batch.lua, the nexts' loop before the ends': its
// replies are kept apart and appended after the ends', as the caller reads them.
func acquiresFirst(t *testing.T, src string) string {
	t.Helper()
	i, j := strings.Index(src, "for j = 0, nexts - 1 do"), strings.Index(src, "return out")
	if i < 0 || j < i {
		t.Fatal("the plant found no nexts' loop in handoff_batch.lua")
	}
	loop := src[i:j]
	planted := plantLua(t, src, loop, "for _, v in ipairs(acq) do out[#out + 1] = v end\n")
	return plantLua(t, planted, "local out = {}\n", "local out, acq = {}, {}\n"+strings.ReplaceAll(loop, "out[#out + 1]", "acq[#acq + 1]"))
}
