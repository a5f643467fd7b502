package demo_test

import (
	"context"
	"fmt"
	"os"

	"github.com/ymirflow/ymirflow/cmd/ymirflow/internal/demo"
)

// A small demo on the embedded Redis with instant agents: every number of the table is
// counted from the streams and the handlers, and follows from the 12 scenarios (one of
// which gets a maintainer's comment during its triage run: delivered, not run).
func ExampleRun() {
	s, err := demo.Run(context.Background(), demo.Options{Issues: 12, Seed: 1, AgentDuration: -1})
	if err != nil {
		fmt.Println(err)
		return
	}
	s.WriteTable(os.Stdout)
	fmt.Println("complete:", s.Complete(), "duplicates:", s.Duplicates.Count(), "labels as planned:", s.AsPlanned)
	// Output:
	// stage          published  run  dropped  delivered  retried  succeeded  failed  dead
	//   triage                12   10        1          1        2          9       1     1
	//   rebase-c9s             1    1        0          0        0          1       0     0
	//   rebase-c10s            1    1        0          0        1          1       0     0
	//   backport-c9s           1    1        0          0        0          1       0     0
	//   backport-c10s          2    1        1          0        0          1       0     0
	//   rebuild-c9s            1    1        0          0        2          0       1     1
	//   rebuild-c10s           1    1        0          0        0          1       0     0
	//   total                 19   16        2          1        5         14       2     2
	// complete: true duplicates: 2 labels as planned: 12
}
