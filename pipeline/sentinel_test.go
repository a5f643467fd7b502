package pipeline_test

import (
	"strings"
	"testing"

	"github.com/ymirflow/ymirflow/pipeline"
)

// A Sentinel URL lists the Sentinels (port 26379 when left out), names the monitored
// primary in its path, keeps the data nodes' credentials where redis:// has them and
// the Sentinels' own in the query; the client built from it is a failover client.
func TestClientOptionsSentinelURL(t *testing.T) {
	t.Parallel()
	o, err := pipeline.ClientOptions("redis+sentinel://ymir:pw@s2,s1:26380/mymaster/2?sentinel_password=spw&sentinel_username=su")
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(o.Addrs, ","); got != "s2:26379,s1:26380" || o.MasterName != "mymaster" || o.DB != 2 ||
		o.Username != "ymir" || o.Password != "pw" || o.SentinelUsername != "su" || o.SentinelPassword != "spw" ||
		o.TLSConfig != nil || o.IsClusterMode {
		t.Fatalf("got %+v", o)
	}
	o, err = pipeline.ClientOptions("rediss+sentinel://s1:26379/primary")
	if err != nil || o.TLSConfig == nil || o.TLSConfig.ServerName != "s1" || o.MasterName != "primary" || o.DB != 0 {
		t.Fatalf("TLS form: %+v, %v", o, err)
	}
	for _, c := range []struct{ url, says string }{
		{"redis+sentinel://s1:26379", "no master name"},
		{"redis+sentinel://s1:26379/", "no master name"},
		{"redis+sentinel:///m", "no Sentinel host"},
		{"redis+sentinel://s1/m/x", `database "x" is not a number`},
		{"redis+sentinel://s1/m/1/2", "more than a master name"},
		{"redis+sentinel://s1/m?sentinel_pasword=x", `unknown parameter "sentinel_pasword"`},
		{"redis+sentinel://u:hunter2@s1/m?x=1", "unknown parameter"},
	} {
		_, err := pipeline.ClientOptions(c.url)
		if err == nil || !strings.Contains(err.Error(), c.says) || !strings.Contains(err.Error(), "redis+sentinel://[user:password@]") {
			t.Errorf("%s: %v, want it to say %q and give the form", c.url, err, c.says)
		}
		if err != nil && strings.Contains(err.Error(), "hunter2") {
			t.Errorf("%s: the error shows the password: %v", c.url, err)
		}
	}
}
