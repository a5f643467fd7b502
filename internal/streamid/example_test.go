package streamid_test

import (
	"fmt"

	"github.com/ymirflow/ymirflow/internal/streamid"
)

func ExampleCompare() {
	// Ids compare as numbers, not as strings.
	fmt.Println(streamid.Compare("9-0", "10-0"), streamid.Compare("1-10", "1-9"))
	id, _ := streamid.Parse("1700000000000-3")
	fmt.Println(id.Next(), id.Time().UTC().Format("2006-01-02 15:04:05"))
	// Output:
	// -1 1
	// 1700000000000-4 2023-11-14 22:13:20
}
