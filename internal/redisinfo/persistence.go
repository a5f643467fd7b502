package redisinfo

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"

	"github.com/redis/go-redis/v9"
)

// Persistence is what a server keeps across its own restart: INFO persistence says
// whether its append-only file is on; CONFIG GET save (when the ACL allows it) which
// snapshots it takes.
type Persistence struct {
	// AOF: appendonly yes. Only the append-only file keeps (nearly) every write,
	// fence counters included, across a restart.
	AOF bool
	// Save is the snapshot schedule ("3600 1 300 100"), "" for none; SaveKnown says
	// whether the server told (CONFIG may be refused).
	Save      string
	SaveKnown bool
}

// Nothing reports a server known to keep nothing across a restart: no append-only file
// and no snapshots.
func (p Persistence) Nothing() bool { return !p.AOF && p.SaveKnown && strings.TrimSpace(p.Save) == "" }

// Lossy returns what a restart of the server loses, or "" when it keeps an append-only
// file.
func (p Persistence) Lossy() string {
	switch {
	case p.AOF:
		return ""
	case p.Nothing():
		return "Redis persists nothing (no append-only file, no snapshots): a restart empties it, losing every stream, pending entry and lease, and fences start again at 1"
	case p.SaveKnown:
		return "Redis keeps no append-only file, only snapshots (save " + p.Save + "): a restart loses the writes since the last snapshot, and the fences handed out since then are handed out again"
	}
	return "Redis keeps no append-only file: a restart loses the writes since the last snapshot, if any, and the fences handed out since then are handed out again"
}

// PersistenceInfo asks rdb's server (each primary of a cluster; the first that keeps no
// append-only file is reported) what it persists. An ACL that forbids INFO is an
// error; one that forbids CONFIG leaves Save unknown.
func PersistenceInfo(ctx context.Context, rdb redis.UniversalClient) (Persistence, error) {
	if c, ok := rdb.(*redis.ClusterClient); ok {
		var mu sync.Mutex
		worst := Persistence{AOF: true}
		err := c.ForEachMaster(ctx, func(ctx context.Context, node *redis.Client) error {
			p, err := nodePersistence(ctx, node)
			mu.Lock()
			defer mu.Unlock()
			if err == nil && worst.AOF && !p.AOF {
				worst = p
			}
			return err
		})
		return worst, err
	}
	return nodePersistence(ctx, rdb)
}

func nodePersistence(ctx context.Context, rdb redis.Cmdable) (Persistence, error) {
	txt, err := rdb.Info(ctx, "persistence").Result()
	if err != nil {
		return Persistence{}, fmt.Errorf("INFO persistence: %w", err)
	}
	var p Persistence
	found := false
	for _, line := range strings.Split(txt, "\n") {
		if k, v, ok := strings.Cut(strings.TrimSpace(line), ":"); ok && k == "aof_enabled" {
			p.AOF, found = v == "1", true
		}
	}
	if !found {
		return Persistence{}, errors.New("INFO persistence: no aof_enabled")
	}
	if save, err := rdb.ConfigGet(ctx, "save").Result(); err == nil {
		p.Save, p.SaveKnown = save["save"], true
	}
	return p, nil
}
